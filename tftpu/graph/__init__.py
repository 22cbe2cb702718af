"""tftpu.graph"""
