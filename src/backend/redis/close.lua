-- close a room: no more joins, no more admissions; streams see `closed`.
-- Returns {'ok'} | {'noroom'}
if not room({}) then return {'noroom'} end
set('closed', '1')
publish_view(false)
return {'ok'}
