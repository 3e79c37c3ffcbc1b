-- Batches (SPEC section 13, G22): a member's move between the membership
-- sets, the events it makes true, each callback pushed once, a settled
-- batch's move in its parent. Shared by batch_open.lua, ack.lua, file.lua.
--
-- Membership sets, never counters: a re-run's second completion finds its
-- member already moved (SREM returns 0) and changes nothing.
--
-- A batch's keys (keys.py BATCH_PARTS, 8 per batch, the member's own batch
-- first, then its ancestors nearest first): hash, members, pending, failed,
-- succeeded, dead, results, order.
-- `ctx` (batch_context): the levels, their bids, N:schedule (a callback is
-- pushed there, due now: the poller moves it to its queue, whose key no
-- script here could name in KEYS beforehand), the TTLs; two KEYS after
-- N:schedule, N:stat:batch_callbacks (callbacks enqueued, by event) and
-- N:batches:open (the open batches), for the metrics.

-- The literal a chord's body holds in place of its first argument.
local BATCH_RESULTS = '"__COGWORKER_RESULTS__"'

local function batch_now()
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call("TIME")
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- `schedule`: the index of N:schedule in KEYS; KEYS from `first`: 8 per
-- level; `bids`: one per level. A level is its bid and the index `k` of
-- its hash, its parts at k + 1 .. k + 7 (the order above).
local function batch_context(schedule, first, bids, ttl, done_ttl)
  local levels = {}
  for i = 1, #bids do
    local k = first + (i - 1) * 8
    levels[i] = {bid = bids[i], k = k}
  end
  return {
    levels = levels, schedule = schedule, stat = schedule + 2, open = schedule + 3,
    ttl = ttl, done_ttl = done_ttl, now = batch_now(),
  }
end

local function batch_expire(b, ttl)
  for part = 0, 7 do
    redis.call("EXPIRE", KEYS[b.k + part], ttl)
  end
end

-- The chord's results in header order, as a JSON list (null for a member
-- that left none: an expired one).
local function batch_results(b)
  local order = redis.call("LRANGE", KEYS[b.k + 7], 0, -1)
  local parts = {}
  for i, member in ipairs(order) do
    local value = redis.call("HGET", KEYS[b.k + 6], member)
    parts[i] = value or "null"
  end
  return "[" .. table.concat(parts, ",") .. "]"
end

-- Fires `event` once (HSETNX), pushing its callback (and, for a chord's
-- success, its body with the results) in the same step.
local function batch_fire(ctx, b, event)
  if redis.call("HSETNX", KEYS[b.k], "fired:" .. event, tostring(ctx.now)) == 0 then return end
  local cb = redis.call("HGET", KEYS[b.k], "cb:" .. event)
  if cb then
    redis.call("ZADD", KEYS[ctx.schedule], ctx.now, cb)
    redis.call("HINCRBY", KEYS[ctx.stat], event, 1)
  end
  if event == "success" then
    local body = redis.call("HGET", KEYS[b.k], "body")
    if body then
      redis.call("HINCRBY", KEYS[ctx.stat], event, 1)
      local at = string.find(body, BATCH_RESULTS, 1, true)
      if at then
        body = string.sub(body, 1, at - 1) .. batch_results(b) .. string.sub(body, at + #BATCH_RESULTS)
      end
      redis.call("ZADD", KEYS[ctx.schedule], ctx.now, body)
    end
  end
end

local batch_move

-- After a move in level `i`: the events now true, in their order (success,
-- complete, settled); a settled batch moves in its parent.
local function batch_check(ctx, i)
  local b = ctx.levels[i]
  if redis.call("SCARD", KEYS[b.k + 2]) > 0 then return end
  local failed = redis.call("SCARD", KEYS[b.k + 3])
  local dead = redis.call("SCARD", KEYS[b.k + 5])
  if failed == 0 and dead == 0 then batch_fire(ctx, b, "success") end
  batch_fire(ctx, b, "complete")
  if failed > 0 then return end
  batch_fire(ctx, b, "settled")
  redis.call("HSET", KEYS[b.k], "settled_at", tostring(ctx.now))
  redis.call("ZREM", KEYS[ctx.open], b.bid)
  batch_expire(b, ctx.done_ttl)
  if ctx.levels[i + 1] then
    batch_move(ctx, i + 1, dead == 0 and "s" or "d", "b:" .. b.bid, "")
  end
end

-- Moves `member` of level `i`: "s" succeeded (from pending or failed; with
-- its `result` for a chord, "" none), "f" failed, a retry due (from
-- pending), "d" dead (from pending or failed), "r" retried from dead (back
-- to failed, while the batch is not settled). Returns 1 if it moved.
batch_move = function(ctx, i, how, member, result)
  local b = ctx.levels[i]
  if redis.call("EXISTS", KEYS[b.k]) == 0 or redis.call("HEXISTS", KEYS[b.k], "settled_at") == 1 then
    return 0  -- expired, deleted from the admin, or settled for good
  end
  local moved = false
  if how == "s" then
    moved = redis.call("SREM", KEYS[b.k + 2], member) == 1 or redis.call("SREM", KEYS[b.k + 3], member) == 1
    if moved then
      redis.call("SADD", KEYS[b.k + 4], member)
      if result ~= "" then redis.call("HSET", KEYS[b.k + 6], member, result) end
    end
  elseif how == "f" then
    moved = redis.call("SREM", KEYS[b.k + 2], member) == 1
    if moved then redis.call("SADD", KEYS[b.k + 3], member) end
  elseif how == "d" then
    moved = redis.call("SREM", KEYS[b.k + 2], member) == 1 or redis.call("SREM", KEYS[b.k + 3], member) == 1
    if moved then
      redis.call("SADD", KEYS[b.k + 5], member)
      batch_fire(ctx, b, "death")
    end
  elseif how == "r" then
    moved = redis.call("SREM", KEYS[b.k + 5], member) == 1
    if moved then redis.call("SADD", KEYS[b.k + 3], member) end
  end
  if not moved then return 0 end
  batch_expire(b, ctx.ttl)
  -- Its ancestors wait for it: kept as long (none of them has settled).
  for up = i + 1, #ctx.levels do
    local above = ctx.levels[up]
    if redis.call("HEXISTS", KEYS[above.k], "settled_at") == 0 then
      batch_expire(above, ctx.ttl)
    end
  end
  batch_check(ctx, i)
  return 1
end

-- A member's end, as ack.lua and file.lua call it: KEYS from `first` are
-- N:schedule, N:queues, N:stat:batch_callbacks, N:batches:open, the next
-- chain step's queue (N:schedule when none), then 8 per level; ARGV from `arg` are: the move, the member, how many
-- levels, their bids, the open TTL, the settled TTL, the result ("" none),
-- the next chain step's payload ("" none), its jid, its queue's name.
-- Returns 1 if the member moved.
--
-- Under SHARDING the batch's keys are in another slot: KEYS from `first`
-- are the group's outbox and its counter, ARGV[arg] is "@outbox" and
-- ARGV[arg + 1] the end as workflows/effects.py wrote it. The end is
-- numbered and queued on the outbox, in the same step as the ack or
-- filing; workflows/forward.py applies it (batch_apply.lua). Returns 1.
local function batch_member_end(first, arg)
  if ARGV[arg] == "@outbox" then
    local seq = redis.call("INCR", KEYS[first + 1])
    redis.call("RPUSH", KEYS[first], seq .. "|" .. ARGV[arg + 1])
    return 1
  end
  local how, member, count = ARGV[arg], ARGV[arg + 1], tonumber(ARGV[arg + 2])
  local bids = {}
  for i = 1, count do bids[i] = ARGV[arg + 2 + i] end
  local a = arg + 3 + count
  local ttl, done_ttl, result = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
  local next_raw, next_jid, next_queue = ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  if next_raw ~= "" then
    -- The next step joins the batch before this one leaves pending, so the
    -- batch stays open until the chain's last step; a settled (or gone)
    -- batch takes no new member, but a step retried from the admin after
    -- it settled still resumes its chain. The ack's LREM made this end the
    -- only one: the next step is pushed once.
    local k = first + 5
    if count > 0 and redis.call("EXISTS", KEYS[k]) == 1 and redis.call("HEXISTS", KEYS[k], "settled_at") == 0 then
      redis.call("SADD", KEYS[k + 1], next_jid)
      redis.call("SADD", KEYS[k + 2], next_jid)
    end
    if KEYS[first + 4] == KEYS[first] then
      -- SHARDING (batch_apply.lua): the step's queue is in another slot;
      -- it joins the schedule, due now, for the forwarder to push.
      redis.call("ZADD", KEYS[first], batch_now(), next_raw)
    else
      redis.call("LPUSH", KEYS[first + 4], next_raw)
      redis.call("SADD", KEYS[first + 1], next_queue)
    end
  end
  if count == 0 then return 0 end
  local ctx = batch_context(first, first + 5, bids, ttl, done_ttl)
  return batch_move(ctx, 1, how, member, result)
end
