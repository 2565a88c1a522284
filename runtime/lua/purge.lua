-- Removes dead letters.
-- KEYS[1] <prefix>dead  KEYS[2] <prefix>dead:info
-- ARGV: the ids; none: every dead letter
-- Returns: how many were removed.
if #ARGV == 0 then
  local n = redis.call('ZCARD', KEYS[1])
  redis.call('UNLINK', KEYS[1], KEYS[2]) -- freed in the background: a big zset's DEL would hold the server up
  return n
end
local n = 0
for first = 1, #ARGV, 1000 do
  local part = {unpack(ARGV, first, math.min(first + 999, #ARGV))}
  n = n + redis.call('ZREM', KEYS[1], unpack(part))
  redis.call('HDEL', KEYS[2], unpack(part))
end
return n
