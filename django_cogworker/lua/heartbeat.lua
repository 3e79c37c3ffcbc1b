--! include count_stats.lua
--! include add_metrics.lua
-- One beat of a worker process.
-- KEYS[1] = process hash (the presence key), KEYS[2] = processes set,
-- KEYS[3] = last_beat hash, KEYS[4] = inprogress_identities set,
-- KEYS[5] = workers hash (jobs running now), KEYS[6] = signals list,
-- KEYS[7] = stat:processed, KEYS[8] = stat:failed,
-- KEYS[9] = stat:processed:<day>, KEYS[10] = stat:failed:<day>,
-- KEYS[11] = stat:processed:minute:<minute>, KEYS[12] =
-- stat:failed:minute:<minute> (the minute of this beat, whenever since the
-- previous one the jobs it carries ended),
-- KEYS[13] = the beats hash ("last": the latest beat of any process;
-- "since": when beats resumed after the last silence longer than the
-- presence TTL; requeue.lua reads both, G2),
-- KEYS[14] = metrics:<minute> (per-job figures of this beat's minute),
-- KEYS[15] = metrics:totals (the same counts, cumulative).
-- ARGV[1] = identity, ARGV[2] = presence TTL (s), ARGV[3] = processed since
-- the last beat, ARGV[4] = failed since the last beat, ARGV[5] = "1" to
-- register in inprogress_identities (reliable fetch), ARGV[6] = TTL of the
-- daily counters (s), ARGV[7] = TTL of the minute counters (s),
-- ARGV[8] = number of process fields F, ARGV[9] = number of metric
-- pairs M, ARGV[10] = TTL of the metrics minute (s),
-- ARGV[11 .. 10+2F] = field, value pairs, then M field, value pairs of
-- metrics (metrics.Tally.increments, see add_metrics.lua), then jid, record
-- pairs of the running jobs.
-- Returns {registered, {signals sent to this process since the last beat...}, full,
-- now}, now = this beat's TIME as "<seconds>.<micros>" (the worker's view of
-- Redis's clock, for expiring jobs),
-- registered = 0 when the registration in KEYS[4] failed (a key of the wrong
-- type); full = 1 when Redis was full (maxmemory reached): the beat was the
-- minimal one, without the counters, the metrics and the running jobs'
-- records, which the caller keeps for a later beat.
if redis.replicate_commands then redis.replicate_commands() end
local identity = ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local nfields = tonumber(ARGV[8])
local nmetrics = tonumber(ARGV[9])
local first_metric = 11 + 2 * nfields
local fields = {}
for i = 11, 10 + 2 * nfields do
  table.insert(fields, ARGV[i])
end
table.insert(fields, "beat")
table.insert(fields, string.format("%.6f", now))
-- The process record is the first write, and a pcall: Redis refuses it
-- when its memory is full (OOM), which is how this beat learns it, before
-- it has written anything. Then the EXPIRE, a write that cannot grow
-- memory, goes first: after a script's first write Redis lets the rest of
-- it write (it cannot stop a script halfway), on 6.2 as on 7. A worker
-- must go on beating on a full Redis, or it would be taken for dead.
local full = 0
local written = redis.pcall("HSET", KEYS[1], unpack(fields))
if type(written) == "table" and written.err then
  if not string.find(written.err, "OOM", 1, true) then
    return redis.error_reply(written.err)
  end
  full = 1
  redis.call("EXPIRE", KEYS[1], ARGV[2])
  redis.call("HSET", KEYS[1], unpack(fields))
end
redis.call("EXPIRE", KEYS[1], ARGV[2])

if full == 0 then
  -- After the record, but before anything can fail: a failure now would
  -- make the caller give its counts back and count them twice.
  count_stats(KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], ARGV[3], ARGV[4], ARGV[6], ARGV[7])
  add_metrics(KEYS[14], KEYS[15], ARGV, first_metric, nmetrics, ARGV[10])
end
redis.call("SADD", KEYS[2], identity)
redis.call("HSET", KEYS[3], identity, string.format("%.6f", now))
-- pcall: a beats hash of the wrong type only weakens the stall check.
local latest = tonumber(redis.pcall("HGET", KEYS[13], "last"))
if (not latest) or now - latest > tonumber(ARGV[2]) then
  redis.pcall("HSET", KEYS[13], "since", string.format("%.6f", now))
end
redis.pcall("HSET", KEYS[13], "last", string.format("%.6f", now))
-- pcall: a registry of the wrong type must not stop the beat itself (G12):
-- failing here, a process would never get past its first beat, and a
-- running one would stop recording its jobs and reading its signals. The
-- caller logs it.
local registered = 1
if ARGV[5] == "1" and type(redis.pcall("SADD", KEYS[4], identity)) ~= "number" then
  registered = 0
end

redis.call("DEL", KEYS[5])
local running = {}
for i = first_metric + 2 * nmetrics, #ARGV do
  table.insert(running, ARGV[i])
end
if #running > 0 and full == 0 then
  redis.call("HSET", KEYS[5], unpack(running))
  redis.call("EXPIRE", KEYS[5], ARGV[2])
end

local signals = redis.call("LRANGE", KEYS[6], 0, -1)
if #signals > 0 then
  redis.call("DEL", KEYS[6])
end
return {registered, signals, full, string.format("%.6f", now)}
