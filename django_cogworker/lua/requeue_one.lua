--! include requeue_job.lua
-- One job, if still on an in-progress list, back on its queue: a give-back
-- (fetched but not going to run) and a stray (on the list, run by no thread).
-- KEYS[1] = in-progress list.
-- ARGV[1] = the job as on the list, ARGV[2..5] = requeue_job's queue prefix,
-- default queue, periodic lock prefix, lock TTL.
-- Returns 1 if moved, 0 if it was no longer on the list.
if not redis.call("LPOS", KEYS[1], ARGV[1]) then
  return 0
end
-- Write, then remove (see requeue.lua).
requeue_job(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
redis.call("LREM", KEYS[1], 1, ARGV[1])
return 1
