"""tftpu.interp"""
