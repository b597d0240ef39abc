# plot.gp — PNG curves from the table extract.py writes.
#   gnuplot -e "datafile='m.dat'; outdir='plots'" plot.gp
# The keys are the header line's ("# step KEY...").  One PNG per key
# (outdir/KEY.png, '/' in the key made '_') and all of them on one page
# (outdir/curves.png).  NaN cells (absent or null) are skipped.
if (!exists("datafile") || !exists("outdir")) {
	print "plot.gp: set datafile and outdir with -e"
	exit status 2
}
keys = system("sed -n '1s/^# step //p' '" . datafile . "'")
n = words(keys)
if (n < 1) {
	print "plot.gp: " . datafile . ": no '# step KEY...' header"
	exit status 1
}
set datafile missing "NaN"
set grid
set key off
set xlabel "step"
slash(s) = strstrt(s, "/") ? slash(s[1:strstrt(s, "/") - 1] . "_" . s[strstrt(s, "/") + 1:]) : s
set terminal pngcairo size 640,400 noenhanced font ",10"
do for [i = 1:n] {
	k = word(keys, i)
	set output outdir . "/" . slash(k) . ".png"
	set title k
	plot datafile using 1:(column(i + 1)) with linespoints pointtype 7 pointsize 0.4 linewidth 1.5
}
cols = ceil(sqrt(n))
rows = ceil(1.0 * n / cols)
set terminal pngcairo size 420 * cols, 280 * rows noenhanced font ",9"
set output outdir . "/curves.png"
set multiplot layout rows, cols
do for [i = 1:n] {
	set title word(keys, i)
	plot datafile using 1:(column(i + 1)) with lines linewidth 1.5
}
unset multiplot
set output
