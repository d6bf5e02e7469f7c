# Bar chart of one scripts/bench run (called by report.py as gnuplot -c chart.gp
# PARAMS). PARAMS is a gnuplot file that report.py writes next to the data:
#   png, title       the PNG to write and its title
#   npanels          panels, stacked top to bottom (two per kind of job that ran: fio
#                    jobs and metadata jobs; throughput, then latency; one for the
#                    copy jobs: throughput)
#   pI_file          panel I's data file          pI_title   its title
#   pI_n             its number of targets        pI_colors  one color per target
#   pI_scale         "log" or "linear"            pI_m       ratio columns in the file
#   pI_labels        1: the x labels carry the ratio lines, 0: the job name alone
# Data files: a header line "job target... r0 r1..." then per job its name, one value
# per target ("-" where a run failed or was not made) and pI_m quoted ratio labels
# (rmemfs over its bound, sshfs and rmemfs-classic, nullfs over nullfs-classic, ...:
# report.py's ratio_labels; empty ones last).
load ARG1

# A job's x label: its name, then one line per ratio label (columns n+2 to n+1+m).
ratio_lines(c) = c > n + 1 + m ? "" : "\n" . stringcolumn(c) . ratio_lines(c + 1)

# Room under each panel for its job labels, one line for the name and one per ratio,
# in pixels, as for the two panels of a 1000-pixel chart.
mmax = 0
do for [i=1:npanels] { mi = value(sprintf("p%d_m", i)); if (mi > mmax) { mmax = mi } }
height = 500 * npanels
spacing = (0.08 + 0.03 * mmax) * 1000.0 / height

# pngcairo draws nicer text; plain png (libgd) is there when cairo is not.
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1500,height font ",10"
} else {
    set terminal png size 1500,height
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

set multiplot layout npanels,1 title title noenhanced \
    margins 0.06,0.88,60.0/height,1-70.0/height spacing 0,spacing

do for [i=1:npanels] {
    f = value(sprintf("p%d_file", i))
    n = value(sprintf("p%d_n", i))
    m = value(sprintf("p%d_m", i))
    colors = value(sprintf("p%d_colors", i))
    set title value(sprintf("p%d_title", i)) noenhanced
    # A linear axis starts at 0, or a small difference would look large.
    if (value(sprintf("p%d_scale", i)) eq "log") {
        set logscale y; set yrange [*:*]
    } else {
        unset logscale y; set yrange [0:*]
    }
    if (value(sprintf("p%d_labels", i))) {
        plot for [c=2:n+1] f using c:xtic(stringcolumn(1).ratio_lines(n+2)) \
            title columnheader(c) lc rgb word(colors, c-1)
    } else {
        plot for [c=2:n+1] f using c:xtic(1) title columnheader(c) lc rgb word(colors, c-1)
    }
}

unset multiplot
