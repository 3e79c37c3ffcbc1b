--! include full_redis.lua
-- Record, before it starts, the one recovered job this process runs (G3):
-- if the process dies, recovery counts an orphaning only for this job.
-- KEYS[1] = this process's suspect key, KEYS[2] = its in-progress list.
-- ARGV[1] = the job as fetched, ARGV[2] = the record's TTL (s).
writable_when_full(KEYS[2])
redis.call("SET", KEYS[1], ARGV[1], "EX", ARGV[2])
return 1
