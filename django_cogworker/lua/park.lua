--! include limits.lua
-- Park a job whose code met a full limiter (`with limiter.acquire():`,
-- errors.OverLimit) once its run has ended: out of the in-progress list,
-- onto the limiter's waiting list for its queue, in one step (G1); or, when
-- the limiter has room again by now, straight back onto its queue (else no
-- release might ever come to wake it).
-- KEYS[1] = in-progress list; KEYS[2..5] = used, promoted, max, queues
-- (lib/limits.lua); KEYS[6] = the queue's waiting list, KEYS[7] = the queue.
-- ARGV[1] = the job as fetched, ARGV[2] = the queue's name, ARGV[3] = kind
-- ("c", "r"), ARGV[4] = n, ARGV[5] = per (s), ARGV[6] = promoted TTL (s),
-- ARGV[7] = "1" when the job must be on the list (reliable fetch), ARGV[8]
-- = its jid (a reservation it holds, as a promoted waiter, is its own).
-- Returns {1, wait} parked (wait as admit.lua), {2} put back on its queue,
-- {0} when the job is no longer on the list (G18: not ours).
local job = ARGV[1]
if ARGV[7] == "1" and not redis.call("LPOS", KEYS[1], job) then
  return {0}
end
local now = limiter_now()
local kind, n, per = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if free_slots(kind, KEYS[2], KEYS[3], KEYS[4], n, per, now, tonumber(ARGV[6]), ARGV[8]) > 0 then
  redis.call("ZREM", KEYS[3], ARGV[8])
  redis.call("RPUSH", KEYS[7], job)
  redis.call("LREM", KEYS[1], 1, job)
  return {2}
end
-- Back at the head of the line if it had been promoted: it keeps its turn.
if redis.call("ZREM", KEYS[3], ARGV[8]) == 1 then
  redis.call("LPUSH", KEYS[6], job)
else
  redis.call("RPUSH", KEYS[6], job)
end
redis.call("SADD", KEYS[5], ARGV[2])
redis.call("LREM", KEYS[1], 1, job)
return {1, tostring(wait_s(kind, KEYS[2], per, now))}
