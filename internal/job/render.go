package job

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/candle-trace/candle-trace/internal/report/text"
)

// Write prints the job view: the ranks' clocks, their updates, the
// collectives and the straggler analysis.
func Write(w io.Writer, j *Job) {
	step := fmt.Sprintf("capture step %d on every rank", j.CaptureStep)
	if j.CaptureStep == 0 {
		step = "DIFFERENT capture steps"
	}
	fmt.Fprintf(w, "Job: %d ranks, %s (%s)\n", len(j.Traces), step, j.Traces[0].Entrypoint)
	al := j.Alignment
	if al.Matched > 0 {
		var res int64
		for _, c := range al.Clocks {
			res = max(res, c.ResidualNS)
		}
		fmt.Fprintf(w, "Clock: wall clocks at open, refined by the ends of %d collectives every rank shares (residual <= %s)\n", al.Matched, ns(res))
	} else {
		fmt.Fprintln(w, "Clock: wall clocks at open (no collectives shared by every rank to refine them)")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  RANK\tTRACE\tRANK FROM\tWALL OFFSET\tCORRECTION\tOFFSET\t")
	for i, t := range j.Traces {
		c := al.Clocks[i]
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t\n", t.Rank, filepath.Base(t.Path), t.RankFrom, signed(c.WallOffsetNS), signed(c.CorrectionNS), signed(c.OffsetNS))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nPer rank (waiting = in a collective before the last rank entered it, running no op; busy = update less waiting)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "  RANK\tSTART\tUPDATE\tCOLLECTIVES\tWAITING\tBUSY\t"
	for _, p := range PhaseNames {
		head += strings.ToUpper(p) + " BUSY\t"
	}
	fmt.Fprintln(tw, head+"LAST IN\t")
	for _, r := range j.Ranks {
		line := fmt.Sprintf("  %d\t%s\t%s\t%s\t%s\t%s\t", r.Rank, signed(r.StartNS-j.Ranks[0].StartNS), ns(r.UpdateNS), ns(r.CollectiveNS), ns(r.WaitNS), ns(r.BusyNS))
		for _, p := range r.Phases {
			line += ns(p.BusyNS) + "\t"
		}
		fmt.Fprintf(tw, "%s%d/%d\t\n", line, r.LastIn, len(j.Collectives))
	}
	tw.Flush()

	if len(j.Collectives) > 0 {
		fmt.Fprintln(w, "\nCollectives (in the order entered; skew = last enter less first, spread = the same for the ends)")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  #\tNAME\tBYTES\tLAST IN\tENTER SKEW\tEND SPREAD\t")
		for _, c := range j.Collectives {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%s\t\n", c.Index, c.Name, text.FormatBytes(c.Bytes), c.LastRank, ns(c.EnterSkewNS), ns(c.EndSpreadNS))
		}
		tw.Flush()
	}
	for _, warn := range j.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}

	a := j.Analysis
	fmt.Fprintln(w, "\nStraggler analysis")
	fmt.Fprintf(w, "  hypothesis: %s\n", a.Hypothesis)
	fmt.Fprintf(w, "  numbers:    %s\n", a.Numbers)
	fmt.Fprintf(w, "  threshold:  %s\n", a.Threshold)
	fmt.Fprintf(w, "  verdict:    %s\n", a.Verdict)
}

func ns(v int64) string { return text.FormatNS(float64(v)) }

func signed(v int64) string {
	if v < 0 {
		return "-" + ns(-v)
	}
	return "+" + ns(v)
}
