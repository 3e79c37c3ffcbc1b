-- Push one job forwarded from {N}:forward into its group (SHARDING:
-- workflows/forward.py): on its queue when due, else in the group's
-- schedule; once, whoever forwards it and however often (a forwarder may
-- crash between this push and the entry's removal from {N}:forward).
-- KEYS[1] = the queue, KEYS[2] = the group's registry of queues, KEYS[3] =
-- the group's schedule, KEYS[4] = the group's forwarded digests (ZSET).
-- ARGV[1] = the payload, ARGV[2] = its digest, ARGV[3] = the queue's
-- name, ARGV[4] = when it is due (epoch s), ARGV[5] = how long a digest
-- is kept (s).
-- Returns 1 if pushed, 0 if it had been already.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call("ZREMRANGEBYSCORE", KEYS[4], "-inf", now - tonumber(ARGV[5]))
if redis.call("ZSCORE", KEYS[4], ARGV[2]) then
  return 0
end
-- The push first: one that fails (a queue key of the wrong type) leaves
-- nothing written, and the job is forwarded again later.
if tonumber(ARGV[4]) > now then
  redis.call("ZADD", KEYS[3], ARGV[4], ARGV[1])
else
  redis.call("LPUSH", KEYS[1], ARGV[1])
  redis.call("SADD", KEYS[2], ARGV[3])
end
redis.call("ZADD", KEYS[4], now, ARGV[2])
return 1
