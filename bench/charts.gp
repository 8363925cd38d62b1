# The charts of bench/README.md, drawn by bench/run.sh (bench_charts in
# bench/lib.sh) from the tab-separated files 80_nocontention and 85_storm
# write beside their tables:
#
#   gnuplot -e "chart = 'nocontention'; data = 'nocontention.tsv'; out = 'nocontention.svg'" bench/charts.gp
#   gnuplot -e "chart = 'storm'; data = 'storm.tsv'; out = 'storm.svg'" bench/charts.gp
#
# nocontention.tsv: variant, label, off_rps, off_ratio, on_rps, on_ratio
# (one row per variant, (a) the bare INSERT and (g) the floor among them);
# storm.tsv: variant, label, dup_p50_ms, dup_p99_ms, rps, effect_ms.
# A | in a label starts its second line.

set terminal svg size 1200,600 dynamic noenhanced font "sans,13" background "white"
set output out
set datafile separator "\t"
set key outside bottom center horizontal Left reverse noautotitle samplen 1.5
set border 3
set xtics nomirror scale 0 font ",11"
set bmargin 6
set ytics nomirror
set grid ytics lc "#dddddd" lt 1
set style fill solid 1.0 noborder
set boxwidth 0.38
set offsets 0.5, 0.5, 0, 0

# a label's two lines
label(s) = strstrt(s, "|") ? s[1:strstrt(s, "|") - 1] . "\n" . s[strstrt(s, "|") + 1:] : s
off = "#4c78a8"
on = "#f58518"

if (chart eq "nocontention") {
	# the floor (g) in each column, and its requests/s
	stats data skip 1 using (strcol(1) eq "g_floor" ? $4 : NaN) name "FLOOR_OFF" nooutput
	stats data skip 1 using (strcol(1) eq "g_floor" ? $6 : NaN) name "FLOOR_ON" nooutput
	stats data skip 1 using 4 name "OFF" nooutput
	stats data skip 1 using 6 name "ON" nooutput
	top = (OFF_max > ON_max ? OFF_max : ON_max) * 1.15
	set yrange [0:top]
	set title "No contention: a new key per request, throughput against a bare INSERT of the payment (80_nocontention)"
	set ylabel "requests/s ÷ (a)'s in the same column (higher is better)"
	set arrow 1 from graph 0, first FLOOR_OFF_max to graph 1, first FLOOR_OFF_max nohead dt 2 lw 2 lc rgb off front
	set arrow 2 from graph 0, first FLOOR_ON_max to graph 1, first FLOOR_ON_max nohead dt 2 lw 2 lc rgb on front
	# the higher line's label above it, the lower one's below, so that
	# two floors close together never write over each other
	off_dy = (FLOOR_OFF_max >= FLOOR_ON_max ? 0.7 : -0.7)
	set label 1 sprintf("floor (g), commits not flushed: %.2f", FLOOR_OFF_max) at graph 0.99, first FLOOR_OFF_max \
		right offset 0, off_dy tc rgb off font ",11" front
	set label 2 sprintf("floor (g), commits flushed: %.2f", FLOOR_ON_max) at graph 0.99, first FLOOR_ON_max \
		right offset 0, -off_dy tc rgb on font ",11" front
	plot data skip 1 using ($0 - 0.2):4 with boxes lc rgb off title "synchronous_commit off", \
		'' skip 1 using ($0 + 0.2):6 with boxes lc rgb on title "synchronous_commit on", \
		'' skip 1 using 0:(0):(""):xtic(label(strcol(2))) with labels, \
		'' skip 1 using ($0 - 0.2):4:(sprintf("%.2f", $4)) with labels offset 0, 0.6 font ",10", \
		'' skip 1 using ($0 + 0.2):6:(sprintf("%.2f", $6)) with labels offset 0, 0.6 font ",10", \
		'' skip 1 using ($0 - 0.2):(0):(sprintf("%.0f/s", $3)) with labels rotate left offset 0, 0.4 font ",9" tc rgb "white", \
		'' skip 1 using ($0 + 0.2):(0):(sprintf("%.0f/s", $5)) with labels rotate left offset 0, 0.4 font ",9" tc rgb "white"
}

if (chart eq "storm") {
	ms(x) = sprintf(x < 1 ? "%.3f" : "%.1f", x)
	stats data skip 1 using 6 name "EFFECT" nooutput
	stats data skip 1 using 4 name "P99" nooutput
	stats data skip 1 using 3 name "P50" nooutput
	set logscale y
	set yrange [P50_min / 3 : (P99_max > EFFECT_max ? P99_max : EFFECT_max) * 3]
	set title "The retry storm: how long a duplicate waits for its answer (85_storm)"
	set ylabel "duplicate's latency, ms (log scale; lower is better)"
	set arrow 1 from graph 0, first EFFECT_max to graph 1, first EFFECT_max nohead dt 2 lw 2 lc rgb "#c00000" front
	set label 1 sprintf("the effect: %g ms (a duplicate that waits for it takes at least this)", EFFECT_max) \
		at graph 0.01, first EFFECT_max left offset 0, 0.7 tc rgb "#c00000" font ",11" front
	plot data skip 1 using ($0 - 0.2):3 with boxes lc rgb off title "p50", \
		'' skip 1 using ($0 + 0.2):4 with boxes lc rgb on title "p99", \
		'' skip 1 using 0:(P50_min):(""):xtic(label(strcol(2)) . sprintf("\n%.0f requests/s", $5)) with labels, \
		'' skip 1 using ($0 - 0.2):3:(ms($3)) with labels offset 0, 0.6 font ",10", \
		'' skip 1 using ($0 + 0.2):4:(ms($4)) with labels offset 0, 0.6 font ",10"
}
