-- count_stats(total_processed, total_failed, day_processed, day_failed,
--             minute_processed, minute_failed, processed, failed, day_ttl,
--             minute_ttl)
-- Adds to the processed and failed counters: the totals, the day's (living
-- `day_ttl` seconds) and the minute's (living `minute_ttl` seconds, for the
-- dashboard's last hour). The one place the counters are written: the
-- heartbeat (batched per beat, so a worker's jobs land in the minute of the
-- beat that carries them) and count.lua (a stop, a job buried by recovery)
-- both call it.
-- Every write is a pcall: a counter that is not an integer (or a key of
-- another type) loses only its own figure. An error would fail the whole
-- call after the counters before it were added (Redis does not roll back),
-- and the heartbeat, which then gives its counts back, would add them twice
-- on every later beat, and never beat again.
local function count_one(n, total, day, minute, day_ttl, minute_ttl)
  if n > 0 then
    redis.pcall("INCRBY", total, n)
    redis.pcall("INCRBY", day, n)
    redis.pcall("EXPIRE", day, day_ttl)
    redis.pcall("INCRBY", minute, n)
    redis.pcall("EXPIRE", minute, minute_ttl)
  end
end

local function count_stats(total_processed, total_failed, day_processed, day_failed,
                           minute_processed, minute_failed, processed, failed, day_ttl, minute_ttl)
  count_one(tonumber(processed), total_processed, day_processed, minute_processed, day_ttl, minute_ttl)
  count_one(tonumber(failed), total_failed, day_failed, minute_failed, day_ttl, minute_ttl)
end
