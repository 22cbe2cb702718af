"""tftpu.backend"""
