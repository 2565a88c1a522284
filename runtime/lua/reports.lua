-- A worker's report of itself, for operators (the dashboard), kept for `ttl`.
-- KEYS[1] <prefix>reports (hash: worker -> '<until ms>|<at ms>|<report JSON>')
-- KEYS[2] <prefix>reports:until (zset: worker by until when)
-- ARGV[1] worker  ARGV[2] ttl (ms)  ARGV[3] the report (JSON)
-- Also removes up to 10 reports that ran out (of workers that stopped): the hash stays as big
-- as the live workers, whether or not anyone lists it. Listing is a plain HSCAN.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local until_ms = string.format('%d', now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], until_ms .. string.format('|%d|', now) .. ARGV[3])
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
local gone = redis.call('ZRANGE', KEYS[2], '-inf', string.format('%d', now), 'BYSCORE', 'LIMIT', 0, 10)
if #gone > 0 then
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end
return 1
