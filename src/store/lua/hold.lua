-- Keep entries a consumer is still working on from being reclaimed: reset the idle
-- time of each entry that is still pending for this consumer (XCLAIM … JUSTID, which
-- counts no delivery), and name the ones it no longer holds (acked meanwhile, or
-- claimed by another consumer after a stall longer than the reclaim idle time). Never
-- takes an entry back from another consumer: that one may already be running it.
--
-- KEYS[1] stream   ARGV[1] group   ARGV[2] consumer   ARGV[3..] entry ids
-- Reply: the ids that are no longer pending for this consumer.
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #p == 1 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
