--! include limits.lua
--! include batches.lua
-- File a failed job in a sorted set (retry or dead) and take it off the
-- in-progress list, in one step.
-- KEYS[1] = in-progress list, KEYS[2] = retry or dead ZSET,
-- KEYS[3] = the job's orphan counter; for a job holding limiter slots,
-- KEYS[4..] and ARGV[7..] as release_slots() in lib/limits.lua reads them
-- (its slots are freed in the same step as the filing); for a member of a
-- batch (SPEC section 13), ARGV[7] = "@batch", then KEYS[4..] and ARGV[8..]
-- as batch_member_end() in lib/batches.lua reads them.
-- ARGV[1] = the job as fetched, ARGV[2] = score (epoch s), ARGV[3] = payload
-- to file, ARGV[4] = "1" to require the job to be on the list (reliable
-- fetch) or "0" (basic fetch: there is no list), ARGV[5] = trim: drop
-- entries scored below this ("" = no trim), ARGV[6] = trim: keep at most
-- this many ("" = no limit).
-- Returns 1 ({1, as ack.lua} with slots), or 0 when the job is no longer
-- in progress (a shutdown or a
-- recovery already put it back: filing it too would run it twice).
if ARGV[4] == "1" and not redis.call("LPOS", KEYS[1], ARGV[1]) then
  return 0
end
-- The counter first: the job ran to its end, so the crashes it sat through
-- before were not its doing (as in ack.lua); and a DEL cannot grow memory,
-- so on a full Redis (maxmemory reached), which refuses a script whose
-- first write may grow it, this one still runs: once a script has written,
-- Redis lets the rest of it write (6.2 and 7 alike).
redis.pcall("DEL", KEYS[3])
-- Write, then remove: Redis does not roll back a script that fails halfway.
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
if ARGV[4] == "1" then
  redis.call("LREM", KEYS[1], 1, ARGV[1])
end
if ARGV[5] ~= "" then
  redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", "(" .. ARGV[5])
end
if ARGV[6] ~= "" then
  redis.call("ZREMRANGEBYRANK", KEYS[2], 0, -(tonumber(ARGV[6]) + 1))
end
if ARGV[7] == "@batch" then
  return {1, batch_member_end(4, 8)}
end
if #KEYS > 3 then
  return {1, release_slots(4, 7)}
end
return 1
