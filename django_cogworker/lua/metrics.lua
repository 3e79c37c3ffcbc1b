--! include add_metrics.lua
-- Adds a process's figures outside a beat: its last ones, as it stops.
-- KEYS[1] = metrics:<minute> (per-job figures of this minute),
-- KEYS[2] = metrics:totals (the counts, cumulative).
-- ARGV[1] = TTL of the metrics minute (s), ARGV[2 ..] = field, value pairs
-- of metrics.Tally.increments.
add_metrics(KEYS[1], KEYS[2], ARGV, 2, (#ARGV - 1) / 2, ARGV[1])
return 1
