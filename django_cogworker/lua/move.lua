-- Move one entry elsewhere, for the inspection API ("retry now", "kill").
-- KEYS[1] = source (a ZSET: schedule/retry/dead; or a LIST: a queue or
-- unsettled), KEYS[2] = destination (a queue LIST or the dead ZSET),
-- KEYS[3] = queues set.
-- ARGV[1] = the entry as stored, ARGV[2] = the payload to write,
-- ARGV[3] = source kind "zset" or "list", ARGV[4] = destination kind
-- "queue" or "zset", ARGV[5] = destination score (zset) or queue name.
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
else
  redis.call("ZADD", KEYS[2], ARGV[5], ARGV[2])
end
if ARGV[3] == "zset" then
  redis.call("ZREM", KEYS[1], ARGV[1])
else
  redis.call("LREM", KEYS[1], 1, ARGV[1])
end
return 1
