--! include requeue_job.lua
--! include full_redis.lua
-- One job, if still on an in-progress list, back on its queue: a give-back
-- (fetched but not going to run) and a stray (on the list, run by no thread).
-- KEYS[1] = in-progress list, KEYS[2] = the job's queue, KEYS[3] = its
-- periodic running lock (only when ARGV[3] is "1").
-- ARGV[1] = the job as on the list, ARGV[2] = its jid, ARGV[3] = "1" if it
-- holds a periodic running lock, ARGV[4] = the lock's TTL (s).
-- Returns 1 if moved, 0 if it was no longer on the list.
if not redis.call("LPOS", KEYS[1], ARGV[1]) then
  return 0
end
writable_when_full(KEYS[1])
local lock_key = false
if ARGV[3] == "1" then lock_key = KEYS[3] end
-- Write, then remove: Redis does not roll back a script that fails halfway.
requeue_job(ARGV[1], KEYS[2], lock_key, ARGV[2], ARGV[4])
redis.call("LREM", KEYS[1], 1, ARGV[1])
return 1
