// Package htmlview writes `candle-trace view`: one self-contained HTML file
// a person opens from disk, offline. It is one more output over the same
// single pass as `report`: Build runs analysis.Analyze and, through
// analysis.Options.Observe, collects what the report summarises away — each
// span's place on its thread, the ops inside, host-clock device intervals,
// the memory records (replayed sorted, with the lifetimes' rules, for the
// curve and the storages live at the peak) and device-memory samples —
// bounded by Limits. The page embeds that as one JSON document next to
// hand-written CSS and JS (go:embed, assets/); nothing is fetched.
//
// Compare sets two pages side by side with compare.Compare; Aggregate draws
// an aggregate summary through aggsummary. It imports analysis, compare,
// aggsummary, health and trace, and nothing imports it but the cli.
package htmlview
