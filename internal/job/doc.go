// Package job reads the traces of one multi-rank job (one candle-graph/trace/10
// trace per rank, as torchrun's processes write them) as one job: it puts the
// ranks on one clock and finds the rank that holds the others back.
//
//   - Alignment (align.go): each trace's session clock starts at
//     meta.clock.wall_unix_ns_at_open, so wall clocks give a first offset per
//     rank. Wall clocks of different hosts disagree, and the session clock
//     leaves the tracer's own time out, so the offsets are refined by what the
//     ranks share: a collective ends on every rank at nearly the same instant
//     (an all-reduce returns when the last rank's data is in), so the median
//     difference of the ranks' collective end times is each rank's correction.
//   - Straggler analysis (straggler.go): per rank the update time, the time in
//     collectives and the part of it spent waiting for a later rank, the busy
//     time per phase, who entered each collective last, and a verdict naming
//     the slow rank and the phase it lost its time in.
//
// Collectives are the ops the binding records for each backend work
// ("gloo:all_reduce", "nccl:all_reduce", ...: the op's start is the moment
// the rank entered the collective, its end the completion, its bytes what it
// carried). The package reads the traces with the streaming reader every
// command shares (report/trace.StreamRecords), skimming the lines it does
// not need (read.go: memory records always, and for the merge's job clock
// everything but the meta and the collectives).
package job
