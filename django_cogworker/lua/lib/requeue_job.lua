-- requeue_job(job, queue_prefix, default_queue, lock_prefix, lock_ttl)
-- Puts one job back onto the end its queue is popped from (RPUSH: queues are
-- pushed on the left and popped from the right), so it runs next. A payload
-- whose `queue` cannot be read goes to `default_queue`, where the processor
-- files it in dead as unreadable. A job of an `until_executed` periodic entry
-- re-takes its running lock on the way, so the ticker cannot start the next
-- slot beside the requeued run.
--
-- The destination key is built from the payload's own queue name: it cannot
-- be known before the payload is read. With a hash-tagged namespace
-- ("{cogworker}") it lands in the same Redis Cluster slot as every other key.
local function retake_running_lock(key, jid, ttl)
  local owner = redis.call("GET", key)
  if (not owner) or owner == jid then
    redis.call("SET", key, jid, "EX", ttl)
  end
end

local function requeue_job(job, queue_prefix, default_queue, lock_prefix, lock_ttl)
  local queue = default_queue
  local ok, decoded = pcall(cjson.decode, job)
  if ok and type(decoded) == "table" then
    if type(decoded["queue"]) == "string" and decoded["queue"] ~= "" then
      queue = decoded["queue"]
    end
    local pjid, jid = decoded["periodic_pjid"], decoded["jid"]
    if decoded["periodic_until_executed"] == true and type(pjid) == "string" and type(jid) == "string" then
      retake_running_lock(lock_prefix .. pjid, jid, lock_ttl)
    end
  end
  redis.call("RPUSH", queue_prefix .. queue, job)
end
