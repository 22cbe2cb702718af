"""tftpu.ir"""
