--! include requeue_job.lua
--! include full_redis.lua
--! include limits.lua
-- Put the jobs of an in-progress list back on their queues: a presumed-dead
-- process's list (orphan recovery), or this process's own on shutdown. The
-- caller read the list and the payloads (requeue.py) and passes every key
-- each job touches; this script re-checks, atomically, that the owner is
-- dead and that each job is still on the list.
--
-- KEYS[1] = the in-progress list, KEYS[2] = its owner's presence key,
-- KEYS[3] = last_beat hash, KEYS[4] = repeat_orphans list, KEYS[5] = dead
-- ZSET, KEYS[6] = the beats hash (heartbeat.lua: "last" beat of any
-- process, "since": when beats last resumed after a silence); KEYS[7] = the
-- owner's holds set (G23), then the holders hash of each slot it holds, in
-- the order of ARGV; then, per job
-- in the order of ARGV, its queue, then its orphan counter if it has one
-- ("c" in its flags), then its periodic running lock if it holds one ("l").
-- ARGV[1] = owner identity; ARGV[2] = orphan threshold (s), or "" to
-- requeue unconditionally (own list, at shutdown); ARGV[3] = the caller's
-- clock (epoch s), used only if TIME is refused; ARGV[4] = the counters'
-- TTL (s); ARGV[5] = MAX_ORPHANINGS; ARGV[6] = the longest silence of all
-- beats (s) not taken for a Redis stall (HEARTBEAT_TTL), or ""; ARGV[7] =
-- the periodic lock TTL (s); ARGV[8] = how many slots the owner holds, then
-- two per slot: the limiter's name and the jid (or "f" and none under
-- SHARDING, KEYS[7] then the group's limits_freeing set); then four per job: the job as on the list,
-- its flags ("d": finished, dropped, which is its ack; "k": kept, the
-- caller hands it to unsettled next; "s": spared, a recovered job the dead
-- process held but had not started, whose orphanings are not counted
-- again; "c", "l": as above), its jid, and the
-- payload to requeue when recovering a dead process's list (marked with
-- "orphaned", its count appended here), or "" to requeue it as it is.
--
-- Returns {moved, <jobs filed straight into dead, raw>...}, or {-1} when the
-- owner turned out to be alive.
--
-- G2: "is the owner really dead?" is decided here, atomically with the
-- requeue. Checked in a separate call, an owner that beat in between would
-- lose the jobs it is still running to a second, parallel run.
local orphans = ARGV[2] ~= ""
if orphans then
  if redis.call("EXISTS", KEYS[2]) == 1 then
    return {-1}
  end
  -- A stamp that is not a number counts as no stamp (the presence key alone
  -- then decides). TIME refused (ACL, proxy) falls back to the caller's
  -- clock rather than failing the whole check.
  local last = tonumber(redis.call("HGET", KEYS[3], ARGV[1]) or "")
  if last then
    if redis.replicate_commands then redis.replicate_commands() end
    local now = tonumber(ARGV[3])
    local ok, time = pcall(redis.call, "TIME")
    if ok then now = tonumber(time[1]) + tonumber(time[2]) / 1000000 end
    -- A stall of Redis itself (DEBUG SLEEP, a slow fork, a paused VM)
    -- silences every process at once: presence keys expire and stamps age
    -- while their owners live. Such a silence shows as a gap longer than a
    -- presence key lives in the beats of all processes; a live owner beats
    -- again within HEARTBEAT_TTL of Redis answering again. So no one is
    -- judged dead while such a gap is under way (nobody beat for that long),
    -- nor until beats have run for that long since it ended.
    if ARGV[6] ~= "" then
      local gap = tonumber(ARGV[6])
      local since = tonumber(redis.call("HGET", KEYS[6], "since") or "")
      local latest = tonumber(redis.call("HGET", KEYS[6], "last") or "")
      if (latest and now - latest > gap) or (since and now - since <= gap) then
        return {-1}
      end
    end
    if now - last <= tonumber(ARGV[2]) then
      return {-1}
    end
  end
end

writable_when_full(KEYS[1])
-- G23: the slots the owner holds are freed here, under the same check as
-- its jobs' requeue, never by a TTL; only where it still holds them (a
-- slot it released, or one another process took since, stays as it is).
local slots = tonumber(ARGV[8])
if not slots then
  -- "f", under SHARDING: the holds are in another slot. The owner is noted
  -- in KEYS[7], its group's set of owners whose slots are to be freed; the
  -- caller frees them and forgets it (limits/sharded.py), or whoever sweeps
  -- the group next, if the caller dies in between.
  redis.call("SADD", KEYS[7], ARGV[1])
  slots = 0
end
for s = 1, slots do
  release_slot(KEYS[7 + s], KEYS[7], ARGV[7 + 2 * s], ARGV[8 + 2 * s], ARGV[1])
end
local moved = 0
local buried = {}
local key = 8 + slots
-- The jobs in the order the caller read them, from the list's left end
-- (fetch pushes onto the left, so newest first): each is RPUSHed onto the
-- end its queue is popped from, so the last written, the oldest, runs
-- first (G4). Each is written where it goes and only then taken off the
-- list (G5): Redis keeps the writes a failing script made before the
-- error. A job whose requeue fails (its queue key of the wrong type)
-- rotates to the other end of the list, where the next pass tries it again.
for i = 9 + 2 * slots, #ARGV, 4 do
  local job, flags, jid, marked = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local queue_key = KEYS[key]
  key = key + 1
  local counter, lock = false, false
  if string.find(flags, "c", 1, true) then counter = KEYS[key]; key = key + 1 end
  if string.find(flags, "l", 1, true) then lock = KEYS[key]; key = key + 1 end
  -- Gone since the caller read the list (acknowledged, or recovered by
  -- another process): nothing to do.
  if redis.call("LPOS", KEYS[1], job) then
    if string.find(flags, "d", 1, true) then
      redis.call("LREM", KEYS[1], 1, job)
      if counter then redis.pcall("DEL", counter) end
    elseif string.find(flags, "k", 1, true) then
      -- kept on the list: the caller hands it to unsettled
    else
      -- Recovering a dead process's list: count the orphanings of this jid
      -- and park it past the limit (G3). A job that kills its own process
      -- (OOM, SIGKILL) would otherwise come back after every crash.
      local count, parked = nil, false
      local counted = orphans and counter and not string.find(flags, "s", 1, true)
      if orphans and counter then
        local current = redis.pcall("GET", counter)
        count = type(current) == "string" and tonumber(current) or nil
        if count == nil and current then
          -- Unusable (not a number, or not a string): start over rather than
          -- let it switch the limit off.
          redis.pcall("DEL", counter)
        end
        count = (count or 0) + (counted and 1 or 0)
        if counted and count > tonumber(ARGV[5]) then
          parked = type(redis.pcall("RPUSH", KEYS[4], job)) == "number"
          if not parked then
            -- Parking list unusable: straight to dead, raw; the caller
            -- completes the entry.
            parked = type(redis.pcall("ZADD", KEYS[5], ARGV[3], job)) == "number"
            if parked then table.insert(buried, job) end
          end
        end
      end
      local requeued = job
      if orphans and marked ~= "" then
        requeued = marked .. tostring(count or 1) .. "}"
      end
      local written = parked or pcall(requeue_job, requeued, queue_key, lock, jid, ARGV[7])
      redis.call("LREM", KEYS[1], 1, job)
      if written then
        if counted then
          redis.pcall("INCR", counter)
          redis.pcall("EXPIRE", counter, ARGV[4])
        end
        moved = moved + 1
      else
        redis.call("RPUSH", KEYS[1], job)
      end
    end
  end
end
local reply = {moved}
for _, job in ipairs(buried) do table.insert(reply, job) end
return reply
