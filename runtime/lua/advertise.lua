-- Records that a worker can run jobs of these types until `ttl` from now (by the server's
-- clock); a later deadline of another worker is kept (GT).
-- KEYS[1] <prefix>types (zset: type -> until when, ms)
-- ARGV[1] ttl (ms), then the types
local time = redis.call('TIME')
local until_ms = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + tonumber(ARGV[1]))
local pairs_ = {}
for i = 2, #ARGV do
  pairs_[#pairs_ + 1] = until_ms
  pairs_[#pairs_ + 1] = ARGV[i]
end
redis.call('ZADD', KEYS[1], 'GT', unpack(pairs_))
return 0
