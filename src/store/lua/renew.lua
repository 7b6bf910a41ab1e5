-- Renew a consumer's hold on its pending entries: for each id still pending *and owned
-- by this consumer*, reset its idle time (XCLAIM … JUSTID, which counts no delivery),
-- so no other consumer's XAUTOCLAIM takes it while the work runs. An entry that
-- another consumer has claimed meanwhile is left alone.
--
-- KEYS[1] stream   ARGV[1] group   ARGV[2] consumer   ARGV[3..] entry ids
-- Reply: one integer per id, 1 = still ours (renewed), 0 = no longer ours.
local out = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
