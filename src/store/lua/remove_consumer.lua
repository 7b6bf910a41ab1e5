-- Remove a consumer from a group only when it holds no pending entries (DELCONSUMER
-- would drop them), atomically.
--
-- KEYS[1] stream   ARGV[1] group   ARGV[2] consumer
-- Reply: 1 when removed, 0 when it still holds entries.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
