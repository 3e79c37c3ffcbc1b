-- count_stats(total_processed, total_failed, day_processed, day_failed,
--             minute_processed, minute_failed, processed, failed, day_ttl,
--             minute_ttl)
-- Adds to the processed and failed counters: the totals, the day's (living
-- `day_ttl` seconds) and the minute's (living `minute_ttl` seconds, for the
-- dashboard's last hour). The one place the counters are written: the
-- heartbeat (batched per beat, so a worker's jobs land in the minute of the
-- beat that carries them) and count.lua (a stop, a job buried by recovery)
-- both call it.
local function count_stats(total_processed, total_failed, day_processed, day_failed,
                           minute_processed, minute_failed, processed, failed, day_ttl, minute_ttl)
  processed, failed = tonumber(processed), tonumber(failed)
  if processed > 0 then
    redis.call("INCRBY", total_processed, processed)
    redis.call("INCRBY", day_processed, processed)
    redis.call("EXPIRE", day_processed, day_ttl)
  end
  if failed > 0 then
    redis.call("INCRBY", total_failed, failed)
    redis.call("INCRBY", day_failed, failed)
    redis.call("EXPIRE", day_failed, day_ttl)
  end
  -- Last, and pcall: a minute counter that is not an integer only loses that
  -- minute's figure. An error here would fail the whole call after the
  -- totals were added (Redis does not roll back), and the heartbeat, which
  -- then gives its counts back, would add them twice.
  if processed > 0 then
    redis.pcall("INCRBY", minute_processed, processed)
    redis.pcall("EXPIRE", minute_processed, minute_ttl)
  end
  if failed > 0 then
    redis.pcall("INCRBY", minute_failed, failed)
    redis.pcall("EXPIRE", minute_failed, minute_ttl)
  end
end
