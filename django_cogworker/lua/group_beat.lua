--! include full_redis.lua
-- One beat of a worker process to its queue group, under SHARDING (SPEC
-- section 16): the liveness that the group's master judges a death by, on
-- its own clock (requeue.lua reads these keys; heartbeat.lua writes the
-- shared records, in the {N} slot, in a call of its own).
-- KEYS[1] = the process's presence key in the group, KEYS[2] = the group's
-- last_beat hash, KEYS[3] = the group's beats hash ("last", "since", as
-- heartbeat.lua writes them without SHARDING), KEYS[4] = the group's
-- inprogress_identities set, KEYS[5] = the process's in-progress list in
-- the group.
-- ARGV[1] = identity, ARGV[2] = presence TTL (s), ARGV[3] = "1" to
-- register in KEYS[4] (reliable fetch).
-- Returns {registered, now}: registered = 0 when the registration failed (a
-- key of the wrong type), now = this master's TIME as "<seconds>.<micros>".
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call("TIME")
local now = string.format("%.6f", tonumber(t[1]) + tonumber(t[2]) / 1000000)
-- A beat must land on a full Redis too, or the process is taken for dead.
writable_when_full(KEYS[5])
redis.call("SET", KEYS[1], now, "EX", ARGV[2])
redis.call("HSET", KEYS[2], ARGV[1], now)
-- pcall: a beats hash of the wrong type only weakens the stall check.
local latest = tonumber(redis.pcall("HGET", KEYS[3], "last"))
if (not latest) or tonumber(now) - latest > tonumber(ARGV[2]) then
  redis.pcall("HSET", KEYS[3], "since", now)
end
redis.pcall("HSET", KEYS[3], "last", now)
local registered = 1
if ARGV[3] == "1" and type(redis.pcall("SADD", KEYS[4], ARGV[1])) ~= "number" then
  registered = 0
end
return {registered, now}
