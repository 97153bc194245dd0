-- open a scheduled room: ARGV[3] = '1' when an operator opens it now
-- (opens_at becomes now), ARGV[4] = how many pre-queue tickets the caller
-- drew, ARGV[5..] = those ticket ids in drawn order. The draw (SHA-256 of
-- the seed and each id, engine::lottery) is done by the caller, since
-- Redis' Lua has no SHA-256; tickets that joined the pre-queue after the
-- caller read it arrived after opens_at and queue behind the draw, in
-- arrival order. The drawn order is kept (`<epoch>:draw`, ids joined by
-- commas) as the draw's public record. Returns {'ok'} | {'noroom'}
if not room({'open', 'qtail'}) then return {'noroom'} end
if M['open'] == '1' then return {'ok'} end
local drawn = tonumber(ARGV[4])
local pre = redis.call('LRANGE', K('pre'), 0, -1)
local placed = {}
local function place(sid)
  if placed[sid] then return end
  placed[sid] = true
  local t = load_ticket(sid)
  if t then enqueue(t) end
end
local record = {}
for i = 1, drawn do
  place(ARGV[4 + i])
  record[i] = ARGV[4 + i]
end
redis.call('SET', K('draw'), table.concat(record, ','))
for _, sid in ipairs(pre) do place(sid) end
redis.call('DEL', K('pre'))
set('open', '1')
if ARGV[3] == '1' then set('opens_at', S(NOW)) end
publish_view(false)
return {'ok'}
