-- count_stats(total_processed, total_failed, day_processed, day_failed,
--             processed, failed, day_ttl)
-- Adds to the processed and failed counters, the totals and the day's; a
-- day's counter lives `day_ttl` seconds. The one place the counters are
-- written: the heartbeat (batched per beat) and count.lua (a stop, a job
-- buried by recovery) both call it.
local function count_stats(total_processed, total_failed, day_processed, day_failed, processed, failed, day_ttl)
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
end
