-- Renews a worker's leases and records its heartbeat, and which leases it holds (for its next
-- incarnation: see expire_own.lua).
-- KEYS[1] <prefix>active  KEYS[2] <prefix>workers  KEYS[3] <prefix>leases:<worker>
-- ARGV[1] worker  ARGV[2] lease TTL (ms), then the tokens
-- Returns: per token, 1 when the lease was held (and is renewed), 0 when it was lost.
local active, workers = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[2])
local time = redis.call('TIME')
local deadline = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + ttl
redis.call('ZADD', workers, deadline, ARGV[1])
if #ARGV < 3 then
  redis.call('DEL', KEYS[3])
  return {}
end
local tokens = {unpack(ARGV, 3)}
local scores = redis.call('ZMSCORE', active, unpack(tokens))
local out, renew = {}, {}
for i, token in ipairs(tokens) do
  if scores[i] then
    out[i] = 1
    renew[#renew + 1] = deadline
    renew[#renew + 1] = token
  else
    out[i] = 0
  end
end
if #renew > 0 then
  redis.call('ZADD', active, 'XX', unpack(renew))
  local held = {}
  for i = 2, #renew, 2 do held[#held + 1] = renew[i] end
  redis.call('SET', KEYS[3], table.concat(held, '\n'), 'PX', 2 * ttl)
else
  redis.call('DEL', KEYS[3])
end
return out
