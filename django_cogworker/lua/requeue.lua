--! include requeue_job.lua
-- Put the jobs of an in-progress list back on their queues: a presumed-dead
-- process's list (orphan recovery), or this process's own on shutdown.
--
-- KEYS[1] = the in-progress list, KEYS[2] = its owner's presence key,
-- KEYS[3] = last_beat hash, KEYS[4] = repeat_orphans list, KEYS[5] = dead ZSET,
-- KEYS[6] = the beats hash (heartbeat.lua: "last" beat of any process,
-- "since": when beats last resumed after a silence).
-- ARGV[1..4] = requeue_job's queue prefix, default queue, periodic lock
-- prefix, lock TTL; ARGV[5] = owner identity; ARGV[6] = orphan threshold in
-- seconds, or "" to requeue unconditionally (own list, at shutdown);
-- ARGV[7] = the caller's clock (epoch s), used only if TIME is refused;
-- ARGV[8] = orphan counter key prefix, ARGV[9] = its TTL, ARGV[10] =
-- MAX_ORPHANINGS; ARGV[11] = the longest silence of all beats (s) that is
-- not taken for a Redis stall (HEARTBEAT_TTL); ARGV[12..] = "d:<job>"
-- (finished, only the ack failed: dropped, which is their ack) or
-- "k:<job>" (kept on the list: the caller hands them to unsettled next).
--
-- Returns {moved, <jobs filed straight into dead, raw>...}, or {-1} when the
-- owner turned out to be alive.
--
-- G2: "is the owner really dead?" is decided here, atomically with the
-- requeue. Checked in a separate call, an owner that beat in between would
-- lose the jobs it is still running to a second, parallel run.
if ARGV[6] ~= "" then
  if redis.call("EXISTS", KEYS[2]) == 1 then
    return {-1}
  end
  -- A stamp that is not a number counts as no stamp (the presence key alone
  -- then decides). TIME refused (ACL, proxy) falls back to the caller's
  -- clock rather than failing the whole check.
  local last = tonumber(redis.call("HGET", KEYS[3], ARGV[5]) or "")
  if last then
    if redis.replicate_commands then redis.replicate_commands() end
    local now = tonumber(ARGV[7])
    local ok, time = pcall(redis.call, "TIME")
    if ok then now = tonumber(time[1]) + tonumber(time[2]) / 1000000 end
    -- A stall of Redis itself (DEBUG SLEEP, a slow fork, a paused VM)
    -- silences every process at once: presence keys expire and stamps age
    -- while their owners live. Such a silence shows as a gap longer than a
    -- presence key lives in the beats of all processes; a live owner beats
    -- again within HEARTBEAT_TTL of Redis answering again. So no one is
    -- judged dead while such a gap is under way (nobody beat for that long),
    -- nor until beats have run for that long since it ended.
    if ARGV[11] ~= "" then
      local gap = tonumber(ARGV[11])
      local since = tonumber(redis.call("HGET", KEYS[6], "since") or "")
      local latest = tonumber(redis.call("HGET", KEYS[6], "last") or "")
      if (latest and now - latest > gap) or (since and now - since <= gap) then
        return {-1}
      end
    end
    if now - last <= tonumber(ARGV[6]) then
      return {-1}
    end
  end
end

local finished, keep = {}, {}
for i = 12, #ARGV do
  local mark, payload = string.sub(ARGV[i], 1, 2), string.sub(ARGV[i], 3)
  if mark == "d:" then finished[payload] = true else keep[payload] = true end
end

local moved = 0
local kept = {}
local buried = {}
-- One pass over the list as it stands, from its left end (fetch pushes onto
-- the left, so newest first): each job is RPUSHed onto the end its queue is
-- popped from, so the last written, the oldest, runs first (G4). Each job is peeked, written
-- where it goes, and only then taken off (G5): Redis keeps the writes a
-- failing script made before the error, so popping first would lose the job
-- whenever the write after it failed. A job whose requeue fails (its queue
-- key of the wrong type) rotates to the other end and cannot hold up the
-- ones behind it; the next pass tries it again.
for _ = 1, redis.call("LLEN", KEYS[1]) do
  local job = redis.call("LINDEX", KEYS[1], 0)
  if not job then
    break
  end
  if finished[job] then
    redis.call("LPOP", KEYS[1])
    local ok, decoded = pcall(cjson.decode, job)
    if ok and type(decoded) == "table" and type(decoded["jid"]) == "string" then
      redis.pcall("DEL", ARGV[8] .. decoded["jid"])
    end
  elseif keep[job] then
    table.insert(kept, redis.call("LPOP", KEYS[1]))
  else
    -- Only when recovering a dead process's list: count the orphanings of
    -- this jid and park it past the limit (G3). A job that kills its own
    -- process (OOM, SIGKILL) would otherwise come back after every crash.
    local counter = nil
    local marked = false
    local parked = false
    if ARGV[6] ~= "" then
      local ok, decoded = pcall(cjson.decode, job)
      if ok and type(decoded) == "table" and type(decoded["jid"]) == "string" then
        counter = ARGV[8] .. decoded["jid"]
        marked = decoded["orphaned"] ~= nil
        local current = redis.pcall("GET", counter)
        local count = type(current) == "string" and tonumber(current) or nil
        if count == nil and current then
          -- Unusable (not a number, or not a string): start over rather than
          -- let it switch the limit off.
          redis.pcall("DEL", counter)
        end
        count = (count or 0) + 1
        if count > tonumber(ARGV[10]) then
          parked = type(redis.pcall("RPUSH", KEYS[4], job)) == "number"
          if not parked then
            -- Parking list unusable: straight to dead, raw; the caller
            -- completes the entry.
            parked = type(redis.pcall("ZADD", KEYS[5], ARGV[7], job)) == "number"
            if parked then table.insert(buried, job) end
          end
        end
      end
    end
    -- A recovered job carries "orphaned": <count> in its payload, so that
    -- the ack of a job that was never orphaned (nearly all of them) need
    -- not touch a counter. Spliced into the text, not re-encoded: cjson
    -- would rewrite numbers and turn empty lists into objects.
    local requeued = job
    if counter and not parked then
      local count = tonumber(redis.pcall("GET", counter)) or 0
      local body = string.match(job, "^(%s*{.*)}%s*$")
      if body and not marked then
        requeued = body .. ',"orphaned":' .. tostring(count + 1) .. "}"
      end
    end
    local written = parked or pcall(requeue_job, requeued, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
    redis.call("LPOP", KEYS[1])
    if written then
      if counter then
        redis.pcall("INCR", counter)
        redis.pcall("EXPIRE", counter, ARGV[9])
      end
      moved = moved + 1
    else
      redis.call("RPUSH", KEYS[1], job)
    end
  end
end
for _, job in ipairs(kept) do
  redis.call("RPUSH", KEYS[1], job)
end
local reply = {moved}
for _, job in ipairs(buried) do table.insert(reply, job) end
return reply
