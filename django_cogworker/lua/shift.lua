-- Under SHARDING (limits/sharded.py): a job that may not run now, moved
-- from the in-progress list onto a list of its group (its queue, or a
-- limiter's waiting list for it) in one step (G1: a job is in exactly one
-- place); onto a waiting list, noted in the group's waiters hash in the
-- same step.
-- KEYS[1] = the in-progress list, KEYS[2] = the list it goes to, KEYS[3] =
-- the group's waiters hash (onto a waiting list only).
-- ARGV[1] = the job as fetched, ARGV[2] = "1" onto the head of a waiting
-- list (a promoted job keeps its turn), else the end fetched or let in
-- next; ARGV[3] = "1" when the job must be on the list (reliable fetch);
-- ARGV[4] = the waiters field ("<limiter>\0<queue>"), ARGV[5] = the
-- limiter's spec (JSON).
-- Returns 1 moved, 0 when the job is no longer on the list (G18: not ours).
local job = ARGV[1]
if ARGV[3] == "1" and not redis.call("LPOS", KEYS[1], job) then
  return 0
end
-- Write, then remove (G5).
if ARGV[2] == "1" then
  redis.call("LPUSH", KEYS[2], job)
else
  redis.call("RPUSH", KEYS[2], job)
end
if KEYS[3] then
  redis.call("HSET", KEYS[3], ARGV[4], ARGV[5])
end
redis.call("LREM", KEYS[1], 1, job)
return 1
