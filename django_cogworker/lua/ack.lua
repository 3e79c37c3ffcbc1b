--! include limits.lua
--! include batches.lua
-- Acknowledge a finished job: an ack no fetch.lua call will carry, or one
-- sent at once (a recovered job, a job that holds a limiter's slot); the
-- exits are listed in acks.py.
-- KEYS[1] = in-progress list, KEYS[2] = the job's orphan counter; for a job
-- holding limiter slots, KEYS[3..] and ARGV[2..] as release_slots() in
-- lib/limits.lua reads them.
-- For a member of a batch or a chain's step (SPEC section 13), ARGV[2] =
-- "@batch", then KEYS[3..] and ARGV[3..] as batch_member_end() in
-- lib/batches.lua reads them: its move in its batch, the next step pushed,
-- in the same step as the ack.
-- ARGV[1] = the job exactly as fetched.
-- Returns 1, or 0 when the job was no longer on the list; with slots,
-- {1, how many limiters have room and waiters on other queues}.
-- The counter goes too: the job got to finish, so the crashes it sat through
-- before were not its doing. Only if the job was still ours (G18): a process
-- revived after its jobs were recovered must not clear the counter of a run
-- that another process now owns, nor free a slot (recovery freed it).
if redis.call("LREM", KEYS[1], -1, ARGV[1]) == 0 then
  return 0
end
redis.pcall("DEL", KEYS[2])
if ARGV[2] == "@batch" then
  return {1, batch_member_end(3, 3)}
end
if #KEYS > 2 then
  return {1, release_slots(3, 2)}
end
return 1
