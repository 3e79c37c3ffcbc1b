-- Limiters (SPEC section 14): the capacity rule and the promotion of
-- waiters, shared by the scripts that admit, park, release and wake.
--
-- A limiter's keys (limits/state.py builds them, in this order):
--   used     its holders HASH jid -> process identity (kind "c",
--            concurrency) or its starts ZSET "<jid>:<usec>" -> start time
--            (kind "r", rate), on Redis's clock;
--   promoted ZSET jid -> when promoted: the reservations of waiters put
--            back on their queue, so that a newcomer cannot take their slot;
--            one never fetched (deleted from its queue) lapses after
--            `promoted_ttl` seconds;
--   max      STRING: an override of n (api.Limit(name).set(n)), else n;
--   queues   SET of the queues whose waiting list is not empty.

local function limiter_now()
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call("TIME")
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- The limit in force: an override written as a whole number >= 0 (digits
-- only, as api.Limit reads it), else n.
local function limit_of(max_key, n)
  local override = redis.pcall("GET", max_key)
  if type(override) == "string" and string.match(override, "^%d+$") then
    return tonumber(override)
  end
  return n
end

-- How many more jobs may start now. `me` (a jid, or false): a promoted
-- job, whose own reservation is not counted against it.
local function free_slots(kind, used, promoted, max_key, n, per, now, promoted_ttl, me)
  redis.call("ZREMRANGEBYSCORE", promoted, "-inf", now - promoted_ttl)
  local taken
  if kind == "c" then
    taken = redis.call("HLEN", used)
  else
    redis.call("ZREMRANGEBYSCORE", used, "-inf", now - per)
    taken = redis.call("ZCARD", used)
  end
  local reserved = redis.call("ZCARD", promoted)
  if me and redis.call("ZSCORE", promoted, me) then reserved = reserved - 1 end
  return limit_of(max_key, n) - taken - reserved
end

-- Seconds until a full rate window lets one more start (its oldest start
-- leaves the window); 0 for a concurrency limiter (a release wakes it).
local function wait_s(kind, used, per, now)
  if kind ~= "r" then return 0 end
  local oldest = redis.call("ZRANGE", used, 0, 0, "WITHSCORES")
  if not oldest[2] then return 0 end
  return math.max(0, tonumber(oldest[2]) + per - now)
end

-- The jid a waiting payload names (its reservation's member), or the
-- payload itself when it names none.
local function jid_of(job)
  local ok, value = pcall(cjson.decode, job)
  if ok and type(value) == "table" and type(value.jid) == "string" and value.jid ~= "" then
    return value.jid
  end
  return job
end

-- Moves up to `free` waiters of one queue, oldest first, back onto the end
-- of the queue that is fetched next, each with a reservation. Returns how
-- many moved.
local function promote(waiting, queue_key, queues, queue_name, promoted, free, now)
  local moved = 0
  while moved < free do
    local job = redis.call("LPOP", waiting)
    if not job then break end
    redis.call("RPUSH", queue_key, job)
    redis.call("ZADD", promoted, now, jid_of(job))
    moved = moved + 1
  end
  if redis.call("EXISTS", waiting) == 0 then
    redis.call("SREM", queues, queue_name)
  end
  return moved
end

-- Frees a concurrency slot if `identity` holds it for `jid` (G18: a revived
-- process's late release finds another holder, or none, and frees
-- nothing), forgetting it in the process's holds set. Returns 1 or 0.
local function release_slot(holders, held, name, jid, identity)
  if redis.call("HGET", holders, jid) ~= identity then return 0 end
  redis.call("HDEL", holders, jid)
  redis.call("SREM", held, name .. "\0" .. jid)
  return 1
end

-- Releases the slots of a finished job (ack.lua, file.lua): KEYS from
-- `first` on are the process's holds set, then 6 per slot (holders,
-- promoted, max, queues, the job's queue's waiting list, the queue); ARGV
-- from `arg` on are the identity, the promoted TTL, then 3 per slot (name,
-- jid, n) and, last, the queue's name. Frees each slot, then promotes
-- waiters of the job's queue into the room made. Returns how many slots
-- still had room with waiters elsewhere (the caller wakes those).
local function release_slots(first, arg)
  if #KEYS < first then return 0 end
  local held, identity, ttl = KEYS[first], ARGV[arg], tonumber(ARGV[arg + 1])
  local queue_name = ARGV[#ARGV]
  local now = nil
  local elsewhere = 0
  local k, a = first + 1, arg + 2
  while k + 5 <= #KEYS do
    local holders, promoted, max_key, queues, waiting, queue_key =
      KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]
    local name, jid, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
    if release_slot(holders, held, name, jid, identity) == 1 and redis.call("EXISTS", queues) == 1 then
      now = now or limiter_now()
      local free = free_slots("c", holders, promoted, max_key, n, 0, now, ttl, false)
      if free > 0 then
        free = free - promote(waiting, queue_key, queues, queue_name, promoted, free, now)
      end
      if free > 0 and redis.call("EXISTS", queues) == 1 then elsewhere = elsewhere + 1 end
    end
    k, a = k + 6, a + 3
  end
  return elsewhere
end
