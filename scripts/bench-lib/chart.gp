# Bar chart of one scripts/bench run (called by report.py with gnuplot -c):
#   ARG1 PNG to write       ARG2 throughput data   ARG3 p99 latency data
#   ARG4 number of targets  ARG5 one color per target (space-separated)
#   ARG6, ARG7 "log" or "linear" for the two panels   ARG8 title
#   ARG9 number of ratio labels per job (the baselines rmemfs is compared with; 0
#        without rmemfs)
# Data files: a header line "job target... vs_<baseline>..." (e.g. vs_tmpfs vs_sshfs
# vs_nullfs), then per job its name, one value per target ("-" where a run failed or
# was not made) and ARG9 quoted labels of rmemfs's throughput over each baseline's
# (empty where a run failed).
png = ARG1
bw = ARG2
lat = ARG3
n = int(ARG4)
colors = ARG5
m = int(ARG9)

# A job's x label: its name, then one line per ratio label (columns n+2 to n+1+m).
ratio_lines(c) = c > n + 1 + m ? "" : "\n" . stringcolumn(c) . ratio_lines(c + 1)

# pngcairo draws nicer text; plain png (libgd) is there when cairo is not.
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1500,1000 font ",10"
} else {
    set terminal png size 1500,1000
}
set output png
set datafile missing "-"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set boxwidth 0.9
set grid ytics
set key outside right top vertical
set xtics noenhanced
set key noenhanced

# Fixed margins with room under the top panel for its job labels, one line for the
# name and one per ratio.
spacing = 0.08 + 0.03 * m
set multiplot layout 2,1 title ARG8 noenhanced margins 0.06,0.88,0.06,0.93 spacing 0,spacing

set title "throughput, MB/s (higher is better)"
# A linear axis starts at 0, or a small difference would look large.
if (ARG6 eq "log") { set logscale y; set yrange [*:*] } else { unset logscale y; set yrange [0:*] }
plot for [i=2:n+1] bw using i:xtic(stringcolumn(1).ratio_lines(n+2)) \
    title columnheader(i) lc rgb word(colors, i-1)

set title "p99 latency, us (lower is better)"
if (ARG7 eq "log") { set logscale y; set yrange [*:*] } else { unset logscale y; set yrange [0:*] }
plot for [i=2:n+1] lat using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)

unset multiplot
