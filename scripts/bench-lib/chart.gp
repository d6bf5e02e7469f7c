# Bar chart of one scripts/bench run (called by report.py with gnuplot -c):
#   ARG1 PNG to write       ARG2 throughput data   ARG3 p99 latency data
#   ARG4 number of targets  ARG5 one color per target (space-separated)
#   ARG6, ARG7 "log" or "linear" for the two panels   ARG8 title
# Data files: a header line "job target... vs_tmpfs vs_sshfs", then per job its name,
# one value per target ("-" where a run failed or was not made) and two quoted labels
# of rmemfs's throughput over each baseline's (empty without one).
png = ARG1
bw = ARG2
lat = ARG3
n = int(ARG4)
colors = ARG5

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

# Fixed margins with room under the top panel for its three-line job labels.
set multiplot layout 2,1 title ARG8 noenhanced margins 0.06,0.88,0.06,0.93 spacing 0,0.14

set title "throughput, MB/s (higher is better)"
if (ARG6 eq "log") { set logscale y } else { unset logscale y }
set yrange [*:*]
plot for [i=2:n+1] bw using i:xtic(stringcolumn(1)."\n".stringcolumn(n+2)."\n".stringcolumn(n+3)) \
    title columnheader(i) lc rgb word(colors, i-1)

set title "p99 latency, us (lower is better)"
if (ARG7 eq "log") { set logscale y } else { unset logscale y }
plot for [i=2:n+1] lat using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)

unset multiplot
