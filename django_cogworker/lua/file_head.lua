--! include batches.lua
-- File the head of a holding list in a sorted set, then drop it from the
-- list: an unsettled record in the retry, dead or schedule set it names, or
-- a parked repeat orphan in dead (with its ProcessDied error).
-- KEYS[1] = the holding list (unsettled, or repeat_orphans), KEYS[2] = the
-- sorted set it goes to.
-- ARGV[1] = the entry as read (the list's head), ARGV[2] = score, ARGV[3] =
-- what to file (the payload, or the dead entry); for a member of a batch
-- (SPEC section 13: a poison pill counts as dead), ARGV[4] = "@batch", then
-- KEYS[3..] and ARGV[5..] as batch_member_end() in lib/batches.lua reads them.
-- Returns 1, or 0 when the head is no longer that entry (another process
-- filed it first).
-- Head only (the callers walk the list in order), so no LPOS: this runs on
-- servers too old for reliable fetch.
if redis.call("LINDEX", KEYS[1], 0) ~= ARGV[1] then
  return 0
end
-- Write, then remove: Redis does not roll back a script that fails halfway.
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
redis.call("LPOP", KEYS[1])
if ARGV[4] == "@batch" then
  batch_member_end(3, 5)
end
return 1
