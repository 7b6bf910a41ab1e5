-- Move due retries back onto the shard's effects stream, atomically: whichever
-- executor runs this first gets a retry, and a popped retry is always queued.
--
-- KEYS[1] retry set (zset)   KEYS[2] effects stream
-- ARGV[1] now (unix ms)   ARGV[2] most retries to move
-- Reply: the number moved.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(due) do
  redis.call('ZREM', KEYS[1], m)
  local ok, fields = pcall(cjson.decode, m)
  if ok and type(fields) == 'table' and #fields >= 2 and #fields % 2 == 0 then
    redis.call('XADD', KEYS[2], '*', unpack(fields))
  else
    -- Keep a malformed member visible (it reaches the dead letters) instead of
    -- dropping it silently.
    redis.call('XADD', KEYS[2], '*', 'malformed-retry', m)
  end
end
return #due
