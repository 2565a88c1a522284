set terminal svg size 900,520 dynamic font 'sans,11' background '#ffffff'
set output "pickup.svg"
set title 'Idle pickup latency, enqueue to handler start, by percentile (median of the runs)'
set xlabel 'percentile'
set ylabel 'µs'
set logscale y
set grid
set key top left
set xtics (10, 25, 50, 75, 90, 95, 99)
plot "pickup.dat" using 1:2 with linespoints lw 2 title "jobrt, ungrouped", "pickup.dat" using 1:3 with linespoints lw 2 title "jobrt, a new group each job", "pickup.dat" using 1:4 with linespoints lw 2 title "bee-queue", "pickup.dat" using 1:5 with linespoints lw 2 title "BullMQ", "pickup.dat" using 1:6 with linespoints lw 2 title "GroupMQ, a new group each job"
