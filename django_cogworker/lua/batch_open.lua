--! include batches.lua
-- Open batches and push their members (SPEC section 13), one or more
-- sections per call (workflows/state.py): a batch with the child batches
-- opened inside its `with` block, all in one step, or one chunk of at most
-- 1,000 members of a large batch. Membership is recorded before any member
-- is pushed, in the same step, so no member's end can come before its
-- membership. A batch's first section writes the hash, the sentinel ":open"
-- in pending (nothing fires while members are still being pushed) and the
-- batch's membership in its parent; its last removes ":open" and fires what
-- is true then (an empty batch: success, complete, settled).
--
-- KEYS[1] = N:batches, KEYS[2] = N:schedule, KEYS[3] = N:queues, KEYS[4] =
-- N:stat:batch_callbacks, KEYS[5] = N:batches:open, then per
-- section: 8 per level as lib/batches.lua reads them (the batch, then its
-- ancestors, nearest first), then the queue of each queue index below.
-- ARGV[1] = the open TTL (s), ARGV[2] = the settled TTL (s), then per
-- section: "1" for a batch's first section, "1" for its last, n (the
-- levels), their n bids; the number of hash fields, then field, value pairs
-- (first section); the number of queues, then their names (in the order of
-- their KEYS); the number of members, then 4 per member: its id (a jid, or
-- "b:<bid>" for a child batch, which is not pushed here), its queue's index
-- (1-based, 0: not pushed), its score in N:schedule ("" to push it on its
-- queue now), its payload.
-- Returns the number of members pushed.
local ttl, done_ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local a, k = 3, 6
local pushed = 0

-- One section from ARGV[a] and KEYS[k]; returns the next a and k.
local function open_section(a, k)
  local first, last = ARGV[a] == "1", ARGV[a + 1] == "1"
  local count = tonumber(ARGV[a + 2])
  local bids = {}
  for i = 1, count do bids[i] = ARGV[a + 2 + i] end
  local ctx = batch_context(2, k, bids, ttl, done_ttl)
  local b = ctx.levels[1]
  a = a + 3 + count
  k = k + 8 * count
  local fields = tonumber(ARGV[a])
  if first then
    for i = 1, fields do
      redis.call("HSET", KEYS[b.k], ARGV[a + 2 * i - 1], ARGV[a + 2 * i])
    end
    redis.call("HSET", KEYS[b.k], "created_at", tostring(ctx.now))
    redis.call("SADD", KEYS[b.k + 2], ":open")
    redis.call("ZADD", KEYS[1], ctx.now, b.bid)
    redis.call("ZADD", KEYS[ctx.open], ctx.now, b.bid)
    local parent = ctx.levels[2]
    if parent and redis.call("EXISTS", KEYS[parent.k]) == 1 then
      -- The parent settles only after this child: it waits for "b:<bid>".
      redis.call("SADD", KEYS[parent.k + 1], "b:" .. b.bid)
      redis.call("SADD", KEYS[parent.k + 2], "b:" .. b.bid)
      batch_expire(parent, ctx.ttl)
    end
  end
  a = a + 2 * fields + 1
  local queues = tonumber(ARGV[a])
  local names = {}
  for i = 1, queues do names[i] = ARGV[a + i] end
  a = a + queues + 1
  local queue_first = k
  k = k + queues
  local members = tonumber(ARGV[a])
  a = a + 1
  local after = a + 4 * members
  local chord = redis.call("HGET", KEYS[b.k], "kind") == "chord"
  -- A settled batch takes no new member (a re-run of a member that had
  -- succeeded adds again): the job is pushed all the same, on its own.
  local live = redis.call("HEXISTS", KEYS[b.k], "settled_at") == 0
  -- Membership first, for every member of the section; then the pushes.
  for m = a, live and after - 1 or 0, 4 do
    redis.call("SADD", KEYS[b.k + 1], ARGV[m])
    redis.call("SADD", KEYS[b.k + 2], ARGV[m])
    if chord then redis.call("RPUSH", KEYS[b.k + 7], ARGV[m]) end
  end
  for m = a, after - 1, 4 do
    local q, at, raw = tonumber(ARGV[m + 1]), ARGV[m + 2], ARGV[m + 3]
    if at ~= "" then
      redis.call("ZADD", KEYS[ctx.schedule], at, raw)
      pushed = pushed + 1
    elseif q > 0 then
      redis.call("LPUSH", KEYS[queue_first + q - 1], raw)
      redis.call("SADD", KEYS[3], names[q])
      pushed = pushed + 1
    end
  end
  if live then batch_expire(b, ctx.ttl) end
  if last then
    redis.call("SREM", KEYS[b.k + 2], ":open")
    batch_check(ctx, 1)
  end
  return after, k
end

while a <= #ARGV do
  a, k = open_section(a, k)
end
return pushed
