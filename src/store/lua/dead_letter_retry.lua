-- Re-queue one dead letter onto the stream it came from and delete it, atomically: an
-- entry is never lost between the two, nor re-queued twice by concurrent retries.
--
-- KEYS[1] dead-letter stream   KEYS[2] target stream (same shard, same slot)
-- ARGV[1] dead-letter id   ARGV[2..] the field/value pairs to append
-- Reply: the new id, or false when the dead letter is gone (retried or dropped).
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return false
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], ARGV[1])
return id
