--! include count_stats.lua
-- Adds to the processed and failed counters outside a beat.
-- KEYS[1] = stat:processed, KEYS[2] = stat:failed, KEYS[3] =
-- stat:processed:<day>, KEYS[4] = stat:failed:<day>, KEYS[5] =
-- stat:processed:minute:<minute>, KEYS[6] = stat:failed:minute:<minute>.
-- ARGV[1] = processed, ARGV[2] = failed, ARGV[3] = the day counters' TTL (s),
-- ARGV[4] = the minute counters' TTL (s).
count_stats(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 1
