"""The admission gate: pure rules (`review -> verdict`) and the aiohttp webhook server around them."""
