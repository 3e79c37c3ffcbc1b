--! include limits.lua
-- Admit a job under its limiters (SPEC section 14), all of them or none,
-- at its start; or, over a limit, park it: out of the in-progress list and
-- onto the limiter's waiting list for its queue in one step (G1: a job is
-- in exactly one place), with no retry counted and nothing failed.
-- KEYS[1] = in-progress list, KEYS[2] = the process's holds set, KEYS[3] =
-- the limiters' registry (N:limits); then 5 per limiter: used, promoted,
-- max (lib/limits.lua), queues, the job's queue's waiting list.
-- ARGV[1] = the job as fetched, ARGV[2] = jid, ARGV[3] = identity, ARGV[4]
-- = the queue's name, ARGV[5] = promoted TTL (s), ARGV[6] = "1" to park
-- over the limit, "0" to refuse only (acquire() in job code: the job parks
-- when its run has ended, park.lua), "m" to refuse and note the queue as
-- having waiters (under SHARDING the job's lists are in another slot: the
-- caller then parks it there, limits/sharded.py; KEYS[1] and the waiting
-- lists are not read, ARGV[7] must be "0"), ARGV[7] = "1" when the job must be on
-- the list (reliable fetch), "0" (basic fetch: there is none); then 5 per
-- limiter: name, kind ("c",
-- "r"), n, per (s), its spec (JSON, for the registry).
-- Returns {1} admitted; {0, name, wait} over the limit of `name` (parked if
-- asked), wait = seconds until a rate window has room (0: a release will
-- wake it), and in mode "m" a fourth: 1 if the job had been promoted (it
-- keeps its turn: the head of the line); {-1} when the job is no longer on
-- the list (G18: not ours).
local inprogress, held, registry = KEYS[1], KEYS[2], KEYS[3]
local job, jid, identity, queue_name = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, park = tonumber(ARGV[5]), ARGV[6] == "1"
if ARGV[7] == "1" and not redis.call("LPOS", inprogress, job) then
  return {-1}
end
local now = limiter_now()
local count = (#KEYS - 3) / 5
for i = 0, count - 1 do
  local k, a = 4 + 5 * i, 8 + 5 * i
  local kind, n, per = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local used, promoted = KEYS[k], KEYS[k + 1]
  local holding = kind == "c" and redis.call("HGET", used, jid) == identity
  if not holding and free_slots(kind, used, promoted, KEYS[k + 2], n, per, now, ttl, jid) <= 0 then
    redis.call("HSET", registry, ARGV[a], ARGV[a + 4])
    if park then
      -- Write, then remove (G5). A promoted job that lost the race keeps
      -- its turn: back at the head of the line.
      if redis.call("ZREM", promoted, jid) == 1 then
        redis.call("LPUSH", KEYS[k + 4], job)
      else
        redis.call("RPUSH", KEYS[k + 4], job)
      end
      redis.call("SADD", KEYS[k + 3], queue_name)
      redis.call("LREM", inprogress, 1, job)
    elseif ARGV[6] == "m" then
      local was = redis.call("ZREM", promoted, jid)
      redis.call("SADD", KEYS[k + 3], queue_name)
      return {0, ARGV[a], tostring(wait_s(kind, used, per, now)), was}
    end
    return {0, ARGV[a], tostring(wait_s(kind, used, per, now))}
  end
end
for i = 0, count - 1 do
  local k, a = 4 + 5 * i, 8 + 5 * i
  local name, kind, per = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 3])
  redis.call("ZREM", KEYS[k + 1], jid)
  if kind == "c" then
    redis.call("HSET", KEYS[k], jid, identity)
    redis.call("SADD", held, name .. "\0" .. jid)
  else
    redis.call("ZADD", KEYS[k], now, jid .. ":" .. string.format("%.6f", now))
    redis.call("PEXPIRE", KEYS[k], math.ceil(per * 1000) + 1000)
  end
  redis.call("HSET", registry, name, ARGV[a + 4])
end
return {1}
