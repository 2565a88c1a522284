-- Workers' reports of themselves, for operators (the dashboard).
-- KEYS[1] <prefix>reports (hash: worker -> '<until ms>|<at ms>|<report JSON>')
-- ARGV[1] 'put': ARGV[2] worker, ARGV[3] ttl (ms), ARGV[4] the report (JSON). Returns 1.
-- ARGV[1] 'list': ARGV[2] HSCAN cursor, ARGV[3] its COUNT. Returns {next cursor, '<at ms>|<report>'
--   of each report found that has not run out}; those that ran out are removed.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if ARGV[1] == 'put' then
  local entry = string.format('%d|%d|', now + tonumber(ARGV[3]), now) .. ARGV[4]
  redis.call('HSET', KEYS[1], ARGV[2], entry)
  return 1
end
local r = redis.call('HSCAN', KEYS[1], ARGV[2], 'COUNT', tonumber(ARGV[3]))
local out, gone = {r[1]}, {}
local found = r[2]
for i = 1, #found, 2 do
  local entry = found[i + 1]
  local bar = string.find(entry, '|', 1, true)
  local until_ms = bar and tonumber(string.sub(entry, 1, bar - 1))
  if until_ms and until_ms > now then
    out[#out + 1] = string.sub(entry, bar + 1)
  else
    gone[#gone + 1] = found[i]
  end
end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
return out
