-- snapshot: the line of a room's main lane as a follower of its change log
-- starts from (on a late start, after a reconnect, or after it missed
-- entries), all read in one atomic step together with the log position it
-- reflects, so following the log from that id loses and repeats nothing.
-- Returns a two-element array: the JSON
--   {r = 'ok', epoch, open, order, seed, drawn, view, version, head, from,
--    back = [qi...], id = last log id, seq = its seq}
-- and the departed bitmap of queue indices [from, issued) as raw bytes
-- (`from` is `head` rounded down to a byte); or {r = 'noroom'} and ''.
if not room({'issued', 'open', 'order', 'seed', 'drawn', 'view', 'view_version'}) then
  return {reply({r = 'noroom'}), ''}
end
local issued = n('issued')
-- Every slot below the lowest one still queued was popped or departed, so
-- the line's head can be taken to be that slot (or the end of the line).
local head = issued
local first = redis.call('ZRANGE', K('q'), 0, 0, 'WITHSCORES')
if #first > 0 then head = tonumber(first[2]) end
local from = head - head % 8
local bits = ''
if issued > from then
  bits = redis.call('GETRANGE', K('dep'), from / 8, math.floor((issued - 1) / 8))
end
local back = {}
local returners = redis.call('ZRANGE', K('back'), 0, -1, 'WITHSCORES')
for i = 2, #returners, 2 do back[#back + 1] = tonumber(returners[i]) end
local last = redis.call('XREVRANGE', LOG, '+', '-', 'COUNT', 1)
local id = '0-0'
if #last > 0 then id = last[1][1] end
return {reply({r = 'ok', epoch = EPOCH, open = M['open'] == '1', order = M['order'] or '',
  seed = M['seed'] or '', drawn = n('drawn'), view = M['view'] or '', version = n('view_version'),
  head = head, from = from, back = back, id = id,
  seq = tonumber(redis.call('GET', P .. 'lseq') or '0')}), bits}
