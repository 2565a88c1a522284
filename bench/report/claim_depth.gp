set terminal svg size 900,520 dynamic font 'sans,11' background '#ffffff'
set output "claim_depth.svg"
set title 'Redis server time of one claim against queue depth (median of the runs; log-log)'
set xlabel 'jobs queued'
set ylabel 'µs of server time per claim'
set logscale xy
set grid
set key top left
plot "claim_depth.dat" using 1:2 with linespoints lw 2 title 'jobrt: one claim script call of 10 jobs', "claim_depth.dat" using 1:3 with linespoints lw 2 title 'hand-made design: one claim of one job (SETNX … LREM)'
