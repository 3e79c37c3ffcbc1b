-- writable_when_full(list_key): lets the rest of the script write on a full
-- Redis (maxmemory reached, with noeviction), where a worker must go on
-- recovering, giving back and settling jobs, each of which frees memory or
-- moves it (SPEC section 8).
-- Redis refuses a script whose first write is a command that may grow
-- memory (RPUSH, SET, ZADD...), but once a script has written it lets the
-- rest run: it cannot stop a script halfway (Redis 6.2 and 7 alike, for a
-- script without a #! line). LTRIM key 0 -1 is such a first write that
-- changes nothing: it keeps every element of a list, does nothing to a key
-- that does not exist, and is pcall'd against a key of another type.
local function writable_when_full(list_key)
  redis.pcall("LTRIM", list_key, 0, -1)
end
