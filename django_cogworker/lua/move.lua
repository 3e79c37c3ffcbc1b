--! include batches.lua
-- Move one entry elsewhere, for the inspection API ("retry now", "kill",
-- and "delete": moved nowhere).
-- KEYS[1] = source (a ZSET: schedule/retry/dead; or a LIST: a queue or
-- unsettled), KEYS[2] = destination (a queue LIST or the dead ZSET),
-- KEYS[3] = queues set.
-- ARGV[1] = the entry as stored, ARGV[2] = the payload to write,
-- ARGV[3] = source kind "zset" or "list", ARGV[4] = destination kind
-- "queue", "zset" or "none" (deleted), ARGV[5] = destination score (zset)
-- or queue name. For a member of a batch (SPEC section 13: killed or
-- deleted, it counts as dead; retried from dead, as live again), ARGV[6] =
-- "@batch", then KEYS[4..] and ARGV[7..] as batch_member_end() in
-- lib/batches.lua reads them.
-- Returns 1, or 0 when the entry is gone (someone else moved it first).
if ARGV[3] == "zset" then
  if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then return 0 end
else
  if not redis.call("LPOS", KEYS[1], ARGV[1]) then return 0 end
end
-- Write, then remove: Redis does not roll back a script that fails halfway.
if ARGV[4] == "queue" then
  redis.call("LPUSH", KEYS[2], ARGV[2])
  redis.call("SADD", KEYS[3], ARGV[5])
elseif ARGV[4] == "zset" then
  redis.call("ZADD", KEYS[2], ARGV[5], ARGV[2])
end
if ARGV[3] == "zset" then
  redis.call("ZREM", KEYS[1], ARGV[1])
else
  redis.call("LREM", KEYS[1], 1, ARGV[1])
end
if ARGV[6] == "@batch" then
  batch_member_end(4, 7)
end
return 1
