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
-- Returns {registered, {signals sent to this process since the last beat...}},
-- registered = 0 when the registration in KEYS[4] failed (a key of the wrong type).
if redis.replicate_commands then redis.replicate_commands() end
local identity = ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

-- Counters first: they are what was done, whatever else fails.
count_stats(KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], ARGV[3], ARGV[4], ARGV[6], ARGV[7])

local nfields = tonumber(ARGV[8])
local nmetrics = tonumber(ARGV[9])
local first_metric = 11 + 2 * nfields
add_metrics(KEYS[14], KEYS[15], ARGV, first_metric, nmetrics, ARGV[10])

local fields = {}
for i = 11, 10 + 2 * nfields do
  table.insert(fields, ARGV[i])
end
table.insert(fields, "beat")
table.insert(fields, string.format("%.6f", now))
redis.call("HSET", KEYS[1], unpack(fields))
redis.call("EXPIRE", KEYS[1], ARGV[2])
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
if #running > 0 then
  redis.call("HSET", KEYS[5], unpack(running))
  redis.call("EXPIRE", KEYS[5], ARGV[2])
end

local signals = redis.call("LRANGE", KEYS[6], 0, -1)
if #signals > 0 then
  redis.call("DEL", KEYS[6])
end
return {registered, signals}
