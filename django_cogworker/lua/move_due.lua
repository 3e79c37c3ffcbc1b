-- Move due jobs from the schedule or retry set to their queues, one batch.
-- KEYS[1] = schedule or retry ZSET, KEYS[2] = queues set,
-- KEYS[3 .. 2+n] = each job's queue list.
-- ARGV = for each job: the entry as in the set, the payload to push (its
-- enqueued_at renewed), its queue name, or "" for a job that expired: it is
-- removed from the set, not pushed.
-- Returns {how many moved, {the 1-based index of each expired job removed}}.
-- A job is moved only if it is still in the set, in
-- the same atomic step, so two pollers never move one job twice. Write, then
-- remove (G5); a queue key of the wrong type leaves its job in the set and
-- does not stop the batch (G12); any other error (READONLY, OOM) stops it
-- and is the caller's (the jobs moved so far are moved whole).
local moved = 0
local dropped = {}
for i = 1, #KEYS - 2 do
  local entry, payload, queue = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  if queue == "" then
    if redis.call("ZREM", KEYS[1], entry) == 1 then
      table.insert(dropped, i)
    end
  elseif redis.call("ZSCORE", KEYS[1], entry) then
    local ok = redis.pcall("LPUSH", KEYS[2 + i], payload)
    if type(ok) == "number" then
      redis.call("SADD", KEYS[2], queue)
      redis.call("ZREM", KEYS[1], entry)
      moved = moved + 1
    elseif not string.find(ok.err or "", "WRONGTYPE", 1, true) then
      return redis.error_reply(ok.err or "LPUSH failed")
    end
  end
end
return {moved, dropped}
