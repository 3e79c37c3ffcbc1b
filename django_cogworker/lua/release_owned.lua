-- Delete a lock only if the given jid owns it.
-- KEYS[1] = the lock key; ARGV[1] = the owner's jid.
-- Returns 1 if deleted, 0 if it was gone or owned by another jid.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
