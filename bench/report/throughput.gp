set terminal svg size 900,520 dynamic font 'sans,11' background '#ffffff'
set output "throughput.svg"
set title 'Jobs/s, queued no-op jobs (median; bars: range)'
set logscale x
set xlabel 'jobs/s'
set ytics nomirror
set yrange [20.7:-0.7]
set grid xtics
set key off
set lmargin 52
set style fill solid 0.6
plot "throughput.dat" using 2:0:(0):2:($0-0.35):($0+0.35):yticlabels(1) with boxxyerror lc rgb '#4477aa', "throughput.dat" using 2:0:3:4 with xerrorbars pt 0 lc rgb '#222222'
