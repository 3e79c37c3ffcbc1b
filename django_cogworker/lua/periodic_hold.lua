--! include requeue_job.lua
-- Take or extend the running lock of an until_executed entry for one run.
-- KEYS[1] = the running lock (periodic:running:<pjid>).
-- ARGV[1] = the run's jid, ARGV[2] = TTL (s).
-- Returns 1 if the jid holds the lock now, 0 if another run holds it.
-- The rule is the one a requeue follows (retake_running_lock): taken when
-- free, extended when owned, never taken from another run.
retake_running_lock(KEYS[1], ARGV[1], ARGV[2])
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return 1
end
return 0
