-- add_metrics(minute_key, totals_key, figures, first, count, minute_ttl)
-- Adds `count` field, value pairs of a tally (metrics.Tally.increments), from
-- figures[first], to the minute's hash and the totals. The kind after the
-- field's last "|" says how: "lo" and "hi" are the fastest and slowest run
-- (µs), kept as the minute's minimum and maximum (the pages clamp their
-- percentiles to them), in the minute's hash only (the totals feed
-- Prometheus, which has no use for them); any other is a count, added with
-- HINCRBY to both. The minute's hash lives `minute_ttl` seconds.
-- pcall throughout: a metrics hash of the wrong type loses only its own
-- figures, never the caller's call (a beat would then give its counts back
-- and count them twice).
local function add_metrics(minute_key, totals_key, figures, first, count, minute_ttl)
  for i = first, first + 2 * count - 1, 2 do
    local field, value = figures[i], figures[i + 1]
    local kind = string.match(field, "[^|]*$")
    if kind == "lo" or kind == "hi" then
      local held = redis.pcall("HGET", minute_key, field)
      held = type(held) == "string" and tonumber(held) or nil
      -- A held value no worker writes (text, negative, past 64 bits) is replaced.
      if held and (held < 0 or held >= 2 ^ 63) then
        held = nil
      end
      local n = tonumber(value)
      if (not held) or (kind == "lo" and n < held) or (kind == "hi" and n > held) then
        redis.pcall("HSET", minute_key, field, value)
      end
    else
      redis.pcall("HINCRBY", minute_key, field, value)
      redis.pcall("HINCRBY", totals_key, field, value)
    end
  end
  if count > 0 then
    redis.pcall("EXPIRE", minute_key, minute_ttl)
  end
end
