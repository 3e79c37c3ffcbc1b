-- Acknowledge a finished job: an ack no fetch.lua call will carry, or one
-- sent at once (a recovered job); the exits are listed in acks.py.
-- KEYS[1] = in-progress list, KEYS[2] = the job's orphan counter.
-- ARGV[1] = the job exactly as fetched.
-- Returns 1, or 0 when the job was no longer on the list.
-- The counter goes too: the job got to finish, so the crashes it sat through
-- before were not its doing. Only if the job was still ours (G18): a process
-- revived after its jobs were recovered must not clear the counter of a run
-- that another process now owns.
if redis.call("LREM", KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
redis.pcall("DEL", KEYS[2])
return 1
